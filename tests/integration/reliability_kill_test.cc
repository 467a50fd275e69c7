// Reliability on real processes (docs/reliability.md): whichever single process dies -- a worker,
// the broker, Redis with AOF -- every job the broker accepted ends with exactly one final result
// in Redis; poison jobs fail instead of killing the fleet; a worker drains on SIGTERM, and a
// broker stopped by SIGTERM leaves its queued jobs to the next one. ctest runs every reliability
// test twice: as they are, and as curve.* with FERRY_TEST_CURVE=1 (CurveZMQ on both broker
// sockets; Fleet makes the keys). Big inputs through kills: reliability_input_test.cc; overload,
// deadlines, cancellation and priorities: reliability_queue_test.cc.
//
// The `tiny` model's weights are fixed (ferry-make-models), so its expected outputs are computed
// here by hand: y[j] = sum_i x[i] * W[i][j] + b[j], W[i][j] = 0.01*(i*8+j) - 0.3, b[j] = 0.1*j.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/metrics/names.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "metrics_scraper.h"
#include "process.h"
#include "reliability_fixture.h"
#include "tiny_reference.h"

namespace ferry::reliability_test {
namespace {

using testutil::TinyExpected;
using testutil::TinyInput;

Job TinyJob(const std::string& id, uint32_t seed) {
  Job j;
  j.id = id;
  j.model = "tiny";
  j.inputs.push_back(Tensor::From<float>(TinyInput(seed), {8}, DType::kFloat32));
  return j;
}

// Every key under the prefix that has no expiry (TTL -1), e.g. a journal that still holds jobs.
std::vector<std::string> KeysWithoutExpiry(Fleet& fleet) {
  std::vector<std::string> out;
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::RedisEndpoint ep;
  ep.port = fleet.redis().port();
  if (!protocol::RedisClient::Connect(ep, 2000, &redis).ok()) return {"(no redis)"};
  std::string cursor = "0";
  do {
    protocol::RedisReply r;
    if (!redis->Command({"SCAN", cursor, "MATCH", "ferry:*", "COUNT", "1000"}, &r).ok())
      return {"(scan failed)"};
    cursor = r.elements.at(0).str;
    for (const auto& key : r.elements.at(1).elements) {
      protocol::RedisReply ttl;
      if (redis->Command({"TTL", key.str}, &ttl).ok() && ttl.integer == -1) out.push_back(key.str);
    }
  } while (cursor != "0");
  return out;
}

int64_t CountResultKeys(Fleet& fleet) {
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::RedisEndpoint ep;
  ep.port = fleet.redis().port();
  if (!protocol::RedisClient::Connect(ep, 2000, &redis).ok()) return -1;
  int64_t n = 0;
  std::string cursor = "0";
  do {
    protocol::RedisReply r;
    if (!redis->Command({"SCAN", cursor, "MATCH", "ferry:result:*", "COUNT", "1000"}, &r).ok())
      return -1;
    cursor = r.elements.at(0).str;
    n += static_cast<int64_t>(r.elements.at(1).elements.size());
  } while (cursor != "0");
  return n;
}

// The ids among `ids` that the broker's journal (a HASH in Redis) holds; {"(no redis)"} when
// Redis does not answer.
std::set<std::string> Journaled(Fleet& fleet, const std::vector<std::string>& ids) {
  std::unique_ptr<protocol::RedisClient> redis = fleet.redis().Connect();
  if (!redis) return {"(no redis)"};
  std::set<std::string> out;
  for (const auto& id : ids) {
    protocol::RedisReply r;
    if (redis->Command({"HEXISTS", protocol::Keys().Journal(), id}, &r).ok() && r.integer == 1)
      out.insert(id);
  }
  return out;
}

// Whether job `id` has a final result in Redis.
bool HasResult(Fleet& fleet, const std::string& id) {
  std::unique_ptr<protocol::RedisClient> redis = fleet.redis().Connect();
  protocol::RedisReply r;
  return redis && redis->Command({"EXISTS", protocol::Keys().Result(id)}, &r).ok() &&
         r.integer == 1;
}

// A counter from the broker's STATS ("counters": {"accepted": n, "requeued": n, ...}); -1 when
// the broker does not answer or has no such counter.
int64_t BrokerCounter(Client& c, const std::string& name) {
  std::string json;
  if (!c.Stats(&json).ok()) return -1;
  size_t at = json.find("\"counters\":");
  if (at == std::string::npos) return -1;
  at = json.find("\"" + name + "\":", at);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + name.size() + 3, nullptr, 10);
}

void ExpectTinyDone(const std::map<std::string, Result>& results,
                    const std::map<std::string, uint32_t>& seeds, const std::string& logs) {
  size_t wrong = 0;
  for (const auto& [id, seed] : seeds) {
    const Result& r = results.at(id);
    if (r.state != JobState::kDone) {
      ADD_FAILURE() << id << ": " << JobStateName(r.state) << " " << r.error.ToString();
      if (++wrong > 5) break;
      continue;
    }
    const std::vector<float> y = r.outputs.at(0).As<float>();
    const std::vector<float> want = TinyExpected(TinyInput(seed));
    ASSERT_EQ(y.size(), want.size()) << id;
    for (size_t j = 0; j < y.size(); ++j) ASSERT_NEAR(y[j], want[j], 1e-4) << id << "[" << j << "]";
  }
  EXPECT_EQ(wrong, 0u) << logs.substr(logs.size() > 20000 ? logs.size() - 20000 : 0);
}

TEST(Reliability, ChaosKillsWorkersEverySecondAndTheBrokerOnceNoJobIsLost) {
  FleetOptions fo;
  fo.workers = 3;
  fo.max_batch = 16;
  // Workers die far more often here than in life: allow more attempts than the default so that
  // this test is about loss, not poisoning (which has its own test).
  fo.broker_args = Concat(kFastHeartbeats, {"--max-attempts", "50"});
  fo.worker_args = kFastHeartbeats;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(3)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);

  constexpr int kJobs = 6000, kPerBatch = 100;
  std::map<std::string, uint32_t> seeds;
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    ids.push_back("chaos-" + std::to_string(i));
    seeds[ids.back()] = static_cast<uint32_t>(i);
  }
  std::atomic<bool> producing{true};
  std::thread producer([&] {
    for (int b = 0; b < kJobs / kPerBatch; ++b) {
      std::vector<Job> jobs;
      for (int i = b * kPerBatch; i < (b + 1) * kPerBatch; ++i)
        jobs.push_back(TinyJob(ids[i], seeds[ids[i]]));
      SubmitUntilAccepted(*c, jobs);
      // Not synchronisation: paces the load, so that jobs keep arriving while workers die.
      std::this_thread::sleep_for(std::chrono::milliseconds(120));
    }
    producing = false;
  });
  std::mt19937 rng(7);
  int kills = 0;
  bool broker_killed = false;
  const auto start = std::chrono::steady_clock::now();
  while (producing) {
    // Not synchronisation: the chaos itself, a kill about every second while jobs flow.
    std::this_thread::sleep_for(std::chrono::milliseconds(900 + rng() % 200));
    if (!producing) break;
    const size_t victim = rng() % fleet.worker_count();
    fleet.worker(victim).Signal(SIGKILL);
    fleet.worker(victim).Wait();
    fleet.StartWorker(victim);
    ++kills;
    if (!broker_killed && std::chrono::steady_clock::now() - start > std::chrono::seconds(4)) {
      fleet.broker().Signal(SIGKILL);
      fleet.broker().Wait();
      fleet.StartBroker();
      broker_killed = true;
    }
  }
  producer.join();
  EXPECT_GE(kills, 5);
  EXPECT_TRUE(broker_killed);

  const auto results = WaitAll(*c, ids);
  ExpectTinyDone(results, seeds, fleet.Logs());
  // Exactly one result per job: one key per id, and nothing else was written.
  EXPECT_EQ(CountResultKeys(fleet), kJobs);
  // Nothing is left behind: the journal empties as jobs finish, every other key expires.
  EXPECT_TRUE(WaitFor([&] { return KeysWithoutExpiry(fleet).empty(); }))
      << KeysWithoutExpiry(fleet).size()
      << " key(s) without expiry, first: " << KeysWithoutExpiry(fleet).front();
  int64_t rerun = 0;
  for (const auto& [id, r] : results) rerun += r.attempt > 1 ? 1 : 0;
  std::printf("chaos: %d worker kills, %lld job(s) finished on a later attempt\n", kills,
              static_cast<long long>(rerun));
}

TEST(Reliability, PoisonJobFailsAfterMaxAttemptsEvenAcrossABrokerRestartAndTheFleetKeepsServing) {
  const int metrics_port = testutil::FreePort();
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"slow"};
  fo.max_batch = 1;
  fo.broker_args = Concat(kFastHeartbeats,
                          {"--max-attempts", "3", "--metrics-port", std::to_string(metrics_port)});
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("poison", 1e6f), &id).ok());  // would run for many minutes
  // Each time the job runs, its worker dies (as a job that crashes the process would do). Before
  // the last time the broker is killed too: its successor goes on counting from the journal.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const pid_t pid = fleet.worker(0).pid();
    ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 1; }, std::chrono::seconds(60)))
        << "attempt " << attempt << ": the job never reached worker " << pid << "\n"
        << fleet.Logs();
    if (attempt == 3) {
      fleet.broker().Signal(SIGKILL);
      fleet.broker().Wait();
      fleet.StartBroker();
      ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 1; }, std::chrono::seconds(60)))
          << "the restored job never reached worker " << pid << "\n"
          << fleet.Logs();
    }
    fleet.worker(0).Signal(SIGKILL);
    fleet.worker(0).Wait();
    fleet.StartWorker(0);
  }
  Result r;
  ASSERT_TRUE(c->Wait("poison", 30000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kFailed);
  EXPECT_EQ(r.error.code(), codes::kPoisoned) << r.error.ToString();
  EXPECT_EQ(r.attempt, 3);
  // The restarted broker saw the last worker die: the job was poisoned then, not requeued.
  EXPECT_EQ(BrokerCounter(*c, "poisoned"), 1) << fleet.Logs();
  EXPECT_EQ(BrokerCounter(*c, "requeued"), 0) << fleet.Logs();
  // And its metrics count it finished `poisoned`, not `failed` (its result's status).
  testutil::Scraper broker{testutil::Url(metrics_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_EQ(broker.Sum(metrics::names::kJobsFinished, {{"status", "poisoned"}}), 1);
  EXPECT_EQ(broker.Sum(metrics::names::kJobsFinished), 1);
  // The fleet is alive: an ordinary job still runs.
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  ASSERT_TRUE(c->Submit(SlowJob("after-poison", 1), &id).ok());
  ASSERT_TRUE(c->Wait("after-poison", 30000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
}

TEST(Reliability, WorkerDrainsUnderLoadAndExitsZero) {
  FleetOptions fo;
  fo.workers = 2;
  fo.models = {"tiny", "slow"};
  fo.max_batch = 4;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(2)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::vector<Job> jobs;
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    jobs.push_back(SlowJob("drain-" + std::to_string(i), 5));  // ~5 ms each: a backlog
    ids.push_back(jobs.back().id);
  }
  SubmitUntilAccepted(*c, jobs);
  // SIGTERM while worker 0 holds jobs: draining is about those.
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) > 0; })) << fleet.Logs();
  fleet.worker(0).Signal(SIGTERM);
  EXPECT_EQ(fleet.worker(0).Wait(std::chrono::seconds(60)), 0) << fleet.worker(0).Log();
  // It finished the jobs it held before leaving: the broker requeued none. (Its last DONE says
  // "bye", so the broker removes it with those jobs and sends it nothing more; before, a DONE
  // and the BYE behind it read in different turns of the broker's loop let new jobs go to the
  // leaving worker, to be requeued at BYE.)
  EXPECT_EQ(BrokerCounter(*c, "requeued"), 0) << fleet.Logs();
  const auto results = WaitAll(*c, ids, 60000);
  for (const auto& [id, r] : results)
    EXPECT_EQ(r.state, JobState::kDone) << id << " " << r.error.ToString();
  EXPECT_EQ(CountResultKeys(fleet), 200);
  EXPECT_TRUE(fleet.WaitForWorkers(1, std::chrono::seconds(10))) << "BYE removes the worker";
}

TEST(Reliability, BrokerSigtermKeepsQueuedJobsForTheNextBroker) {
  Fleet fleet(OneFastSlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  std::vector<Job> jobs = {SlowJob("sig-blocker", 1500)};
  for (int i = 0; i < 5; ++i) jobs.push_back(SlowJob("sig-" + std::to_string(i), 1));
  SubmitUntilAccepted(*c, jobs);
  // Stop the broker while most jobs wait in its queue: it stops, keeps them journaled, exits 0.
  fleet.broker().Signal(SIGTERM);
  EXPECT_EQ(fleet.broker().Wait(std::chrono::seconds(30)), 0) << fleet.broker().Log();
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id);
  // Every job without a result stays in the journal. The worker holds at most two of the six
  // (max batch 1 x (1 instance + 1)), so at least four waited in the broker's queue.
  const std::set<std::string> journaled = Journaled(fleet, ids);
  EXPECT_GE(journaled.size(), 4u) << fleet.broker().Log();
  for (const auto& id : ids)
    EXPECT_TRUE(journaled.count(id) == 1 || HasResult(fleet, id)) << id << " is lost";
  fleet.StartBroker();
  for (const auto& [id, r] : WaitAll(*c, ids, 60000))
    EXPECT_EQ(r.state, JobState::kDone) << id << " " << r.error.ToString() << fleet.Logs();
  EXPECT_EQ(CountResultKeys(fleet), 6);
}

// A job still running when the broker dies, whose deadline passes before the next broker is up,
// ends `done`. The worker re-announces with the jobs it holds (READY "held"), and the restarted
// broker leaves them with it: it neither expires them nor sends them elsewhere. Before, the
// restored job expired at once (its deadline had passed), and the worker's result lost to that
// `expired` though the job ran. A job that waited at the broker with such a deadline is parked
// for the workers to claim, and expires when none does.
TEST(Reliability, AJobRunningWhenTheBrokerDiesEndsDoneThoughItsDeadlinePassedMeanwhile) {
  FleetOptions fo = OneFastSlowLane();
  // A liveness period of 2 s: the parked jobs wait that long for a worker's claim.
  const int metrics_port = testutil::FreePort();
  fo.broker_args = {
      "--heartbeat-ms", "100", "--liveness", "20", "--metrics-port", std::to_string(metrics_port)};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  // Seconds on the executor (0.13 ms a step on this VM, about 1 ms on others): it must outlive
  // the broker's kill (up to 3 s after the submit) and its restart (3.5 s), or its DONE reaches
  // the first broker and there is nothing to restore. (8,000 steps, once thought 8 s, took 1 s.)
  Job running = SlowJob("deadline-running", 40000);
  running.timeout_ms = 3000;                           // it starts at once: well within
  Job prefetched = SlowJob("deadline-prefetched", 1);  // the worker's second slot, no deadline
  Job waiting = SlowJob("deadline-waiting", 1);        // at the broker, behind the two
  waiting.timeout_ms = 3000;
  const auto submitted = std::chrono::steady_clock::now();
  SubmitUntilAccepted(*c, {running, prefetched, waiting});
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << fleet.Logs();
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  ASSERT_LT(std::chrono::steady_clock::now() - submitted, std::chrono::milliseconds(3000))
      << "the broker was killed after the deadlines: this machine is too slow for this test";
  // Not synchronisation: the broker stays down until both deadlines have passed.
  std::this_thread::sleep_until(submitted + std::chrono::milliseconds(3500));
  fleet.StartBroker();
  const auto results = WaitAll(*c, {running.id, prefetched.id, waiting.id}, 120000);
  EXPECT_EQ(results.at(running.id).state, JobState::kDone)
      << results.at(running.id).error.ToString() << fleet.Logs();
  EXPECT_EQ(results.at(running.id).attempt, 1) << "it ran once, on the worker that had it";
  EXPECT_EQ(results.at(prefetched.id).state, JobState::kDone)
      << results.at(prefetched.id).error.ToString();
  EXPECT_EQ(results.at(waiting.id).state, JobState::kExpired)
      << JobStateName(results.at(waiting.id).state);
  EXPECT_NE(fleet.broker().Log().find("2 restored job(s) reach their deadline"), std::string::npos)
      << fleet.broker().Log();
  EXPECT_NE(fleet.broker().Log().find("still holds 2 job(s); 2 of them"), std::string::npos)
      << fleet.broker().Log();
  // The restarted broker counts the two it left with the worker as dispatched (no chunk took
  // them), and not the one that expired parked.
  testutil::Scraper broker{testutil::Url(metrics_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_EQ(broker.Sum(metrics::names::kJobsDispatched, {{metrics::names::kLabelModel, "slow"}}),
            2);
  EXPECT_EQ(CountResultKeys(fleet), 3);
}

// Queued jobs keep their order across two broker restarts. A broker numbers the jobs it accepts
// from 0, and its journal records keep those numbers, by which the next broker orders what it
// restores; so a broker that restored jobs numbered 5 and 6 must number its own after them.
// Before, it started again at 0: after a second restart its first job ran before them.
TEST(Reliability, QueuedJobsKeepTheirOrderAcrossTwoBrokerRestarts) {
  Fleet fleet(OneFastSlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  std::vector<std::string> warm;  // jobs 0..4 of the first broker, done
  for (int i = 0; i < 5; ++i) warm.push_back("order-warm-" + std::to_string(i));
  std::vector<Job> warm_jobs;
  for (const auto& id : warm) warm_jobs.push_back(SlowJob(id, 1));
  SubmitUntilAccepted(*c, warm_jobs);
  for (const auto& [id, r] : WaitAll(*c, warm)) ASSERT_EQ(r.state, JobState::kDone) << id;
  // No worker from here on: the jobs wait at the broker (the model stays known).
  fleet.worker(0).Signal(SIGKILL);
  fleet.worker(0).Wait();
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  SubmitUntilAccepted(*c, {SlowJob("order-a", 1)});  // 5 and 6 at the first broker
  SubmitUntilAccepted(*c, {SlowJob("order-b", 1)});
  fleet.broker().Signal(SIGTERM);
  ASSERT_EQ(fleet.broker().Wait(std::chrono::seconds(30)), 0) << fleet.broker().Log();
  fleet.StartBroker();
  SubmitUntilAccepted(*c, {SlowJob("order-c", 1)});  // the second broker's first
  fleet.broker().Signal(SIGTERM);
  ASSERT_EQ(fleet.broker().Wait(std::chrono::seconds(30)), 0) << fleet.broker().Log();
  fleet.StartBroker();
  fleet.StartWorker(0);  // one job at a time now: max batch 1, in queue order
  const auto results = WaitAll(*c, {"order-a", "order-b", "order-c"});
  auto dispatched = [&](const std::string& id) {
    const Result& r = results.at(id);
    EXPECT_EQ(r.state, JobState::kDone) << id << " " << r.error.ToString();
    auto it = r.timing_us.find("dispatched");
    return it == r.timing_us.end() ? int64_t{0} : it->second;
  };
  EXPECT_LE(dispatched("order-a"), dispatched("order-b"));  // may go in one turn
  EXPECT_LT(dispatched("order-b"), dispatched("order-c")) << "a later job ran first";
}

// A journal record the next broker cannot read (damaged, or written by a newer broker) is an
// accepted job all the same: it fails with a result that says why, instead of vanishing, and its
// record goes. The record here is put in place of a real one while the broker is down. Its
// model unknown, the metrics count it under no model (no series of an empty model appears).
TEST(Reliability, AJobWhoseJournalRecordCannotBeReadFailsAfterARestart) {
  const int metrics_port = testutil::FreePort();
  FleetOptions fo;
  fo.workers = 0;
  fo.models = {"slow"};
  fo.broker_args = {"--metrics-port", std::to_string(metrics_port)};
  Fleet fleet(fo);
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  auto redis = fleet.redis().Connect();
  ASSERT_TRUE(redis);
  protocol::RedisReply r;
  ASSERT_TRUE(
      redis->Command({"HSET", protocol::Keys().Journal(), "unreadable-1", "not msgpack"}, &r).ok());
  fleet.StartBroker();
  auto c = MakeClient(fleet);
  Result result;
  ASSERT_TRUE(c->Wait("unreadable-1", 30000, &result).ok()) << fleet.Logs();
  EXPECT_EQ(result.state, JobState::kFailed);
  EXPECT_EQ(result.error.code(), codes::kInternal) << result.error.ToString();
  EXPECT_NE(result.error.message().find("journal record"), std::string::npos)
      << result.error.message();
  EXPECT_TRUE(WaitFor([&] {
    protocol::RedisReply n;
    return redis->Command({"HLEN", protocol::Keys().Journal()}, &n).ok() && n.integer == 0;
  })) << "the record stayed in the journal";
  testutil::Scraper broker{testutil::Url(metrics_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_EQ(broker.Sum(metrics::names::kJobsFinished), 0);
  for (const metrics::Sample& sample : broker.last.samples) {
    const auto model = sample.labels.find(metrics::names::kLabelModel);
    EXPECT_TRUE(model == sample.labels.end() || !model->second.empty()) << sample.name;
  }
}

// A Redis without persistence that restarts loses the journal. The broker notices (Redis's
// run_id changed) and writes its pending jobs to the journal again, so a broker killed after
// that still leaves them to the next one. Before, the journal stayed empty: the jobs the broker
// had accepted were gone with it.
TEST(Reliability, ARedisThatRestartedEmptyGetsThePendingJobsJournaledAgain) {
  FleetOptions fo = OneFastSlowLane();  // a Redis without persistence (Fleet's default)
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  // No worker from here on: the jobs wait at the broker (the model stays known).
  fleet.worker(0).Signal(SIGKILL);
  fleet.worker(0).Wait();
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  const std::vector<std::string> ids = {"rejournal-0", "rejournal-1", "rejournal-2"};
  std::vector<Job> jobs;
  for (const auto& id : ids) jobs.push_back(SlowJob(id, 1));
  SubmitUntilAccepted(*c, jobs);
  ASSERT_EQ(Journaled(fleet, ids).size(), 3u);
  fleet.redis().Restart();  // empty: no AOF, no snapshot
  EXPECT_TRUE(WaitFor([&] { return Journaled(fleet, ids).size() == 3; }))
      << "the journal stayed empty\n"
      << fleet.broker().Log();
  EXPECT_NE(fleet.broker().Log().find("Redis restarted (its run_id changed): writing the 3 "
                                      "pending job(s)"),
            std::string::npos)
      << fleet.broker().Log();
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  fleet.StartBroker();
  fleet.StartWorker(0);
  for (const auto& [id, r] : WaitAll(*c, ids, 60000))
    EXPECT_EQ(r.state, JobState::kDone) << id << " " << r.error.ToString() << fleet.Logs();
}

TEST(Reliability, RedisStoppedAndRestartedWithAofLosesNothing) {
  const int metrics_port = testutil::FreePort();
  FleetOptions fo;
  fo.workers = 2;
  fo.redis_append_only = true;
  fo.broker_args = {"--metrics-port", std::to_string(metrics_port)};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(2)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  constexpr int kJobs = 3000, kPerBatch = 100;
  std::map<std::string, uint32_t> seeds;
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    ids.push_back("aof-" + std::to_string(i));
    seeds[ids.back()] = static_cast<uint32_t>(i);
  }
  std::atomic<int> batches{0};
  std::thread producer([&] {
    for (int b = 0; b < kJobs / kPerBatch; ++b) {
      std::vector<Job> jobs;
      for (int i = b * kPerBatch; i < (b + 1) * kPerBatch; ++i)
        jobs.push_back(TinyJob(ids[i], seeds[ids[i]]));
      SubmitUntilAccepted(*c, jobs);  // `unavailable` while Redis is down: retried
      ++batches;
      // Not synchronisation: paces the load, so that jobs keep arriving during the outage.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  ASSERT_TRUE(WaitFor([&] { return batches.load() >= 8; }));
  fleet.redis().Stop();
  // Not synchronisation: the outage itself, long enough for SUBMITs to meet it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  fleet.redis().Restart();
  producer.join();
  const auto results = WaitAll(*c, ids);
  ExpectTinyDone(results, seeds, fleet.Logs());
  EXPECT_EQ(CountResultKeys(fleet), kJobs);
  // The broker noticed the outage: it could not journal the jobs that came meanwhile and
  // rejected them as `unavailable` (the producer retried them).
  testutil::Scraper broker{testutil::Url(metrics_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_GE(broker.Sum(metrics::names::kJobsRejected,
                       {{metrics::names::kLabelCode, codes::kUnavailable}}),
            1)
      << fleet.broker().Log();
}
}  // namespace
}  // namespace ferry::reliability_test
