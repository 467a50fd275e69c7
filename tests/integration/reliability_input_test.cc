// Big inputs through kills on real processes (docs/reliability.md): inputs the producer stored
// in Redis (a claim check) and inputs attached to the SUBMIT in data frames of their own come
// through a broker killed while they wait in its queue, attached ones through a worker killed
// while it holds them too; every output is the job's own input (null model). ctest runs them
// twice, like every reliability test: as they are, and as curve.* with FERRY_TEST_CURVE=1.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"
#include "reliability_fixture.h"

namespace ferry::reliability_test {
namespace {

// Kills the broker, starts a new one and waits for every job: each after the blocker (jobs[0])
// must end done with its own input as its output (the null model). The results go to *results.
void KillBrokerAndExpectInputsBack(Client& c, Fleet& fleet, const std::vector<Job>& jobs,
                                   std::map<std::string, Result>* results) {
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  fleet.StartBroker();
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id);
  *results = WaitAll(c, ids, 60000);
  for (size_t i = 1; i < jobs.size(); ++i) {
    const Result& r = results->at(jobs[i].id);
    ASSERT_EQ(r.state, JobState::kDone) << jobs[i].id << " " << r.error.ToString() << fleet.Logs();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << jobs[i].id;
  }
}

// Jobs whose big inputs the producer stored in Redis (a claim check: the broker journals only
// their dtype and shape): a broker killed while they wait in its queue is replaced, the new one
// restores them from the journal, and the worker reads their inputs from Redis -- every output
// is the job's own input (null model). A queued one that is cancelled has its input deleted by
// the broker with the `cancelled` result; no input key is left at the end.
TEST(Reliability, StoredInputsSurviveABrokerKillAndGoWithTheirJobs) {
  Fleet fleet(BigJobsBehindASlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  std::vector<Job> jobs = {SlowJob("kill-blocker", 2000)};
  for (int i = 0; i < 5; ++i)  // 200 KB each: stored in Redis
    jobs.push_back(BigNullJob("kill-big-" + std::to_string(i), 1.0f + i));
  SubmitUntilAccepted(*c, jobs);
  std::string cancelled_id;
  Job victim = jobs[1];
  victim.id = "kill-cancelled";
  ASSERT_TRUE(c->Submit(victim, &cancelled_id).ok());
  ASSERT_TRUE(c->Cancel(cancelled_id).ok());
  EXPECT_TRUE(WaitFor([&] {
    std::string v;
    bool found = true;
    auto redis = fleet.redis().Connect();
    return redis && redis->Get(protocol::Keys().Input(cancelled_id, 0), &v, &found).ok() && !found;
  })) << "the cancelled job's stored input is still in Redis";
  std::map<std::string, Result> results;
  ASSERT_NO_FATAL_FAILURE(KillBrokerAndExpectInputsBack(*c, fleet, jobs, &results));
  EXPECT_EQ(InputKeys(fleet), 0) << "input key(s) left";
}

// Big inputs sent through the broker in data frames of their own (attached: the client stores
// nothing in Redis). A worker killed while it holds one gets it requeued, and the broker sends
// its frames again; the broker journals them with their bytes, so one killed while they wait in
// its queue is replaced, the new one restores them from the journal and sends them to the
// worker in the ordinary form -- every output is the job's own input (null model).
TEST(Reliability, AttachedInputsSurviveAWorkerKillAndABrokerKill) {
  Fleet fleet(BigJobsBehindASlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000, /*stored_input_bytes=*/0);
  std::vector<Job> jobs = {SlowJob("att-kill-blocker", 2000)};
  for (int i = 0; i < 5; ++i)  // 200 KB each: attached
    jobs.push_back(BigNullJob("att-kill-" + std::to_string(i), 2.0f + i));
  SubmitUntilAccepted(*c, jobs);
  // The worker holds the blocker and the first big job (its frames) when it is killed: the
  // broker requeues both and sends the big job's frames again, from the same buffers.
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << fleet.Logs();
  fleet.worker(0).Signal(SIGKILL);
  fleet.worker(0).Wait();
  fleet.StartWorker(0);
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, fleet.worker(0).pid()) == 2; })) << fleet.Logs();
  {
    auto redis = fleet.redis().Connect();
    ASSERT_NE(redis, nullptr);
    EXPECT_EQ(InputKeys(fleet), 0) << "attached inputs were stored in Redis";
    protocol::RedisReply entry;
    ASSERT_TRUE(redis->Command({"HSTRLEN", "ferry:journal", "att-kill-4"}, &entry).ok());
    EXPECT_GT(entry.integer, 200000) << "the journal entry lacks the input's bytes";
  }
  std::map<std::string, Result> results;
  ASSERT_NO_FATAL_FAILURE(KillBrokerAndExpectInputsBack(*c, fleet, jobs, &results));
  EXPECT_GE(results.at("att-kill-0").attempt, 2) << "the killed worker's job was not requeued";
}

// The broker sends a turn's jobs to workers before that turn's journal write; when the write
// fails it rejects them `unavailable`, yet a job already on a worker still runs. So the producer
// leaves a job's stored inputs when the rejection is `unavailable` (they expire), and the job
// ends `done`, not `failed`/`not_found` for inputs its producer deleted. Here the journal write
// fails because Redis refuses HSET (an ACL rule), and the worker is stopped (SIGSTOP) while the
// rejection reaches the producer, so that it reads the inputs only after that.
TEST(Reliability, AJobRejectedUnavailableAfterItsDispatchStillFindsItsStoredInputs) {
  FleetOptions fo;
  fo.workers = 1;  // the one the test stops (a second would take the job, or join in step)
  fo.models = {"null"};
  fo.worker_args = {"--instances", "1"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 5000);
  auto admin = fleet.redis().Connect();
  ASSERT_TRUE(admin);
  protocol::RedisReply r;
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "-hset"}, &r).ok());  // no journal
  Job j = BigNullJob("rejected-but-dispatched", 3.5f);
  fleet.worker(0).Signal(SIGSTOP);  // the CHUNK waits in its socket
  std::string id;
  Status s = c->Submit(j, &id);
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "+hset"}, &r).ok());
  fleet.worker(0).Signal(SIGCONT);
  ASSERT_EQ(s.code(), codes::kUnavailable) << s.ToString() << fleet.Logs();
  Result result;
  ASSERT_TRUE(c->Wait(id, 30000, &result).ok()) << fleet.Logs();
  ASSERT_EQ(result.state, JobState::kDone) << result.error.ToString() << fleet.Logs();
  EXPECT_TRUE(result.outputs.at(0).data == j.inputs[0].data);
  EXPECT_TRUE(WaitFor([&] { return InputKeys(fleet) == 0; }))
      << "the worker did not delete the input with the result";
}

// Stored inputs go only with the job's final result: a worker killed while it holds a job
// whose input it has read from Redis gets the job requeued, and the next worker reads the input
// again -- every output is the job's own input (null model), and no input key is left.
TEST(Reliability, StoredInputsSurviveAWorkerKill) {
  Fleet fleet(BigJobsBehindASlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  std::vector<Job> jobs = {SlowJob("st-kill-blocker", 2000)};
  for (int i = 0; i < 4; ++i) jobs.push_back(BigNullJob("st-kill-" + std::to_string(i), 4.0f + i));
  SubmitUntilAccepted(*c, jobs);
  EXPECT_EQ(InputKeys(fleet), 4) << "the inputs were not stored in Redis";
  // The worker holds the blocker and st-kill-0 when it is killed: the broker requeues both.
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << fleet.Logs();
  fleet.worker(0).Signal(SIGKILL);
  fleet.worker(0).Wait();
  fleet.StartWorker(0);
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id);
  auto results = WaitAll(*c, ids, 60000);
  for (size_t i = 1; i < jobs.size(); ++i) {
    const Result& r = results.at(jobs[i].id);
    ASSERT_EQ(r.state, JobState::kDone) << jobs[i].id << " " << r.error.ToString() << fleet.Logs();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << jobs[i].id;
  }
  EXPECT_GE(results.at("st-kill-0").attempt, 2) << "the killed worker's job was not requeued";
  EXPECT_TRUE(WaitFor([&] { return InputKeys(fleet) == 0; })) << InputKeys(fleet) << " left";
}

// A job whose deadline passes while it waits at the broker gets its `expired` result from the
// broker, which deletes the job's stored input with it (final_results.cc).
TEST(Reliability, AJobThatExpiresAtTheBrokerTakesItsStoredInputWithIt) {
  FleetOptions fo = OneSlowLane();
  fo.models = {"slow", "null"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  // Two slow jobs fill the worker (max batch 1 x 2): the next job waits at the broker.
  SubmitUntilAccepted(*c, {SlowJob("exp-blocker-0", 3000), SlowJob("exp-blocker-1", 3000)});
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, fleet.worker(0).pid()) == 2; })) << fleet.Logs();
  Job late = BigNullJob("exp-big", 7.0f);
  late.timeout_ms = 500;  // long before a place on the worker opens (~3 s)
  std::string id;
  ASSERT_TRUE(c->Submit(late, &id).ok());
  EXPECT_EQ(InputKeys(fleet), 1) << "the input was not stored in Redis";
  Result r;
  ASSERT_TRUE(c->Wait(id, 30000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kExpired) << r.error.ToString();
  EXPECT_TRUE(WaitFor([&] { return InputKeys(fleet) == 0; }))
      << "the expired job's stored input is still in Redis";
  for (const char* blocker : {"exp-blocker-0", "exp-blocker-1"}) {
    ASSERT_TRUE(c->Wait(blocker, 30000, &r).ok());
    EXPECT_EQ(r.state, JobState::kDone) << blocker;
  }
}

// A stored input lives as long as its producer's input_ttl_s says: a job still waiting at the
// broker when its input expires fails `not_found` on the worker that reads it (the bytes are
// gone; nothing else can run it), and the worker keeps serving.
TEST(Reliability, AJobWhoseStoredInputExpiredBeforeItRanFailsNotFound) {
  FleetOptions fo = OneSlowLane();
  fo.models = {"slow", "null"};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 5000, 64 * 1024, /*input_ttl_s=*/1);
  // Two slow jobs fill the worker (max batch 1 x 2): no place opens for ~4 s, so the next job
  // waits at the broker, and its input expires after 1 s.
  SubmitUntilAccepted(*c, {SlowJob("ttl-blocker-0", 4000), SlowJob("ttl-blocker-1", 4000)});
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, fleet.worker(0).pid()) == 2; })) << fleet.Logs();
  std::string id;
  ASSERT_TRUE(c->Submit(BigNullJob("ttl-big", 8.0f), &id).ok());
  Result r;
  ASSERT_TRUE(c->Wait(id, 30000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kFailed) << r.error.ToString();
  EXPECT_EQ(r.error.code(), codes::kNotFound) << r.error.ToString();
  for (const char* blocker : {"ttl-blocker-0", "ttl-blocker-1"}) {
    ASSERT_TRUE(c->Wait(blocker, 30000, &r).ok());
    EXPECT_EQ(r.state, JobState::kDone) << blocker;
  }
  std::string again;  // the worker still serves big jobs
  Job next = BigNullJob("ttl-next", 9.0f);
  ASSERT_TRUE(c->Submit(next, &again).ok());
  ASSERT_TRUE(c->Wait(again, 30000, &r).ok());
  ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  EXPECT_TRUE(r.outputs.at(0).data == next.inputs[0].data);
}

}  // namespace
}  // namespace ferry::reliability_test
