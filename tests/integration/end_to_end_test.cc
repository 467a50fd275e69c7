// The whole job path on real components: redis-server, ferry-broker and ferry-worker processes
// on free ports, ZeroMQ over TCP, TorchScript models, and the producer SDK -- results equal to
// direct model calls, batches forming, small results inside FINISHED or the worker's notices,
// Client::Run, many producer threads on one client, STATS and the worker's thread names. Big
// inputs: end_to_end_input_test.cc; what models take and refuse: end_to_end_model_test.cc. The
// same fleet spoken to over raw wire frames: wire_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "end_to_end_fixture.h"
#include "ferry/client.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry::end_to_end_test {
namespace {

TEST_F(EndToEnd, ResultsEqualDirectModelCallsAndBatchesForm) {
  FleetOptions o;
  o.workers = 2;
  o.max_batch = 16;
  StartFleet(o);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 600; ++i) jobs.push_back(TinyJob(i));
  auto results = RunAll(*client_, jobs, *fleet_);
  std::set<std::string> workers;
  int64_t max_batch = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_LT(testutil::MaxAbsDiff(r.outputs[0], expected[0]), 1e-5) << "job " << i;
    EXPECT_EQ(r.model, "tiny");
    EXPECT_GE(r.batch_size, 1);
    EXPECT_LE(r.batch_size, 16);
    EXPECT_EQ(r.attempt, 1);
    for (const char* k :
         {"submitted", "dispatched", "received", "compute_start", "compute_end", "finished"})
      EXPECT_GT(r.timing_us.count(k) ? r.timing_us.at(k) : 0, 0) << k;
    EXPECT_LE(r.timing_us.at("submitted"), r.timing_us.at("dispatched"));
    EXPECT_LE(r.timing_us.at("compute_start"), r.timing_us.at("compute_end"));
    workers.insert(r.worker);
    max_batch = std::max(max_batch, r.batch_size);
  }
  EXPECT_GT(max_batch, 1) << "no batch larger than 1 formed under load";
  EXPECT_EQ(workers.size(), 2u) << "both workers should take work";
}

// Reads (GET, MGET) Redis has served so far.
int64_t RedisReads(Fleet& fleet) { return CommandCalls(fleet, {"get", "mget"}); }

// Small results travel back inside FINISHED (worker DONE -> broker -> producer): Wait returns
// them without reading Redis, and they are exactly what Redis holds. With the worker's
// --inline-result-bytes 0 the same jobs are read from Redis and give the same results.
// (push_results off: this is the broker's path; the next test covers the worker's notices.)
TEST_F(EndToEnd, SmallResultsComeInsideFinishedAndEqualTheRecordsInRedis) {
  for (const bool inline_on : {true, false}) {
    FleetOptions o;
    o.workers = 1;
    if (!inline_on) o.worker_args = {"--inline-result-bytes", "0"};
    fleet_ = std::make_unique<Fleet>(o);
    ASSERT_TRUE(fleet_->WaitForWorkers(1)) << fleet_->Logs();
    client_ = Connect(*fleet_, /*push_results=*/false);
    std::vector<Job> jobs;
    for (uint32_t i = 0; i < 200; ++i) jobs.push_back(TinyJob(1000 + i));
    const int64_t reads_before = RedisReads(*fleet_);
    std::vector<Result> results;
    std::vector<std::string> ids;
    for (const Job& j : jobs) {  // one at a time: each Wait starts before its FINISHED
      std::string id;
      ASSERT_TRUE(client_->Submit(j, &id).ok());
      Result r;
      ASSERT_TRUE(client_->Wait(id, 60000, &r).ok()) << fleet_->Logs();
      ids.push_back(id);
      results.push_back(std::move(r));
    }
    const int64_t reads = RedisReads(*fleet_) - reads_before;
    if (inline_on) {
      // Only the SDK's safety-net re-check (a job slower than 50 ms on a loaded machine) reads.
      EXPECT_LT(reads, 20) << "results were read from Redis, not taken from FINISHED";
    } else {
      EXPECT_GE(reads, 1) << "without inline results the SDK must read Redis";
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
      ASSERT_EQ(results[i].outputs.size(), 1u);
      EXPECT_LT(testutil::MaxAbsDiff(results[i].outputs[0], expected[0]), 1e-5) << i;
      Result stored;  // the record in Redis, read directly
      ASSERT_TRUE(client_->Poll(ids[i], &stored).ok());
      ASSERT_EQ(stored.state, JobState::kDone);
      EXPECT_EQ(stored.outputs.at(0).data, results[i].outputs[0].data) << i;
      EXPECT_EQ(stored.timing_us, results[i].timing_us) << i;
      EXPECT_EQ(stored.worker, results[i].worker);
    }
    client_.reset();
    fleet_.reset();
  }
}

// At light load the SDK names its Redis channel in SUBMIT ("notify"): the worker publishes each
// result notice there as it writes the result (one script: SET NX, then PUBLISH), the SDK's
// Wait returns from it, and the records equal Redis's. With --inline-result-bytes 0 the notices
// carry ids only and the SDK reads the records.
TEST_F(EndToEnd, LightLoadResultNoticesComeStraightFromTheWorker) {
  for (const bool inline_on : {true, false}) {
    FleetOptions o;
    o.workers = 1;
    if (!inline_on) o.worker_args = {"--inline-result-bytes", "0"};
    StartFleet(o);
    const int64_t published_before = CommandCalls(*fleet_, {"publish"});
    const int64_t reads_before = RedisReads(*fleet_);
    constexpr int kJobs = 100;
    std::vector<Job> jobs;
    std::vector<std::string> ids;
    std::vector<Result> results(kJobs);
    for (int i = 0; i < kJobs; ++i) {  // one at a time: light load
      jobs.push_back(TinyJob(2000 + i));
      ids.emplace_back();
      ASSERT_TRUE(client_->Submit(jobs[i], &ids[i]).ok());
      ASSERT_TRUE(client_->Wait(ids[i], 60000, &results[i]).ok()) << fleet_->Logs();
    }
    EXPECT_EQ(CommandCalls(*fleet_, {"publish"}) - published_before, kJobs) << "one notice per job";
    const int64_t reads = RedisReads(*fleet_) - reads_before;
    if (inline_on) {
      // Only the SDK's safety-net re-check (a job slower than 50 ms on a loaded machine) reads.
      EXPECT_LT(reads, 20) << "results were read from Redis, not taken from the notices";
    } else {
      EXPECT_GE(reads, kJobs) << "notices without records: each result is read";
    }
    for (int i = 0; i < kJobs; ++i) {
      const Result& r = results[i];
      ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
      EXPECT_LT(testutil::MaxAbsDiff(r.outputs.at(0), expected[0]), 1e-5) << i;
      Result stored;  // the record in Redis, read directly
      ASSERT_TRUE(client_->Poll(ids[i], &stored).ok());
      EXPECT_EQ(stored.outputs.at(0).data, r.outputs[0].data) << i;
      EXPECT_EQ(stored.timing_us, r.timing_us) << i;
    }
    client_.reset();
    fleet_.reset();
  }
}

// Client::Run on the real fleet, with and without notices from the worker: the model's results;
// a rejection as Run's status.
TEST_F(EndToEnd, RunReturnsTheModelsResultsAndRejections) {
  StartFleet(FleetOptions{1});
  for (const bool push : {true, false}) {
    auto c = Connect(*fleet_, push);
    for (int i = 0; i < 30; ++i) {
      const Job job = TinyJob(3000 + i);
      Result r;
      std::string id;
      Status s = c->Run(job, 60000, &r, &id);
      ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << fleet_->Logs();
      ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
      EXPECT_EQ(r.id, id);
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), job.inputs);
      EXPECT_LT(testutil::MaxAbsDiff(r.outputs.at(0), expected[0]), 1e-5) << i;
    }
  }
  Job bad = TinyJob(1);
  bad.model = "no-such-model";
  Result r;
  EXPECT_EQ(client_->Run(bad, 60000, &r).code(), "unknown_model");
}

// Run with the id of a job that is still pending waits for THAT job (the broker rejects the
// resubmission as a duplicate, and nothing runs twice): the way to keep waiting after a timeout.
TEST_F(EndToEnd, RunOfAPendingIdWaitsForTheJobAlreadyThere) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"slow"};
  StartFleet(o);
  auto slow = [](const std::string& id, float spins) {
    Job j;
    j.id = id;
    j.model = "slow";
    j.inputs = {Tensor::From<float>({spins}, {1}, DType::kFloat32)};  // ~1 ms per spin
    return j;
  };
  // Result writes: a plain SET, or the SET inside the notice script (Redis counts both).
  const int64_t writes_before = CommandCalls(*fleet_, {"set"});
  ASSERT_TRUE(client_->Submit(slow("run-pending", 1000), nullptr).ok());
  Result r;
  Status s = client_->Run(slow("run-pending", 1), 60000, &r);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << fleet_->Logs();
  ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  EXPECT_EQ(r.outputs.at(0).As<float>(), std::vector<float>{1000.f})
      << "Run returned its own input's result";
  // One worker runs jobs in order: once a later job is done, a second run of "run-pending"
  // (had the resubmission been accepted) would have written its result too.
  Result after;
  ASSERT_TRUE(client_->Run(slow("run-after", 1), 60000, &after).ok()) << fleet_->Logs();
  EXPECT_EQ(CommandCalls(*fleet_, {"set"}) - writes_before, 2)
      << "result writes: run-pending once, run-after once";
}

TEST_F(EndToEnd, StatsListWorkersAndQueues) {
  StartFleet(FleetOptions{2});
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find("\"workers\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"queues\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"tiny\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"credit\""), std::string::npos) << json;
}

// Each of the worker's threads says what it does, for `top -H`, perf and gdb
// (docs/operations.md, "Threads"). The main thread, whose name is the process's, is
// ferry-worker: the worker re-executes itself (for OMP_WAIT_POLICY, when it is not set) by its
// real path, not as /proc/self/exe, which named it "exe" for pgrep, ps -C and killall.
TEST_F(EndToEnd, WorkerThreadsAreNamedAfterTheirRole) {
  unsetenv("OMP_WAIT_POLICY");  // the worker inherits it: with it unset, it re-executes itself
  FleetOptions o{1};
  o.worker_args = {"--instances", "2"};
  StartFleet(o);
  RunAll(*client_, {TinyJob(1), TinyJob(2)}, *fleet_);
  std::set<std::string> names;
  const std::string tasks = "/proc/" + std::to_string(fleet_->worker(0).pid()) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream comm(t.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  for (const char* want : {"ferry-link", "ferry-fetch", "ferry-results", "ferry-exec-0",
                           "ferry-exec-1", "ferry-signals", "ferry-worker"})
    EXPECT_EQ(names.count(want), 1u)
        << want << " missing among " << ::testing::PrintToString(names);
}

// A worker whose --redis-prefix is not the broker's would write results where no producer reads
// them (small ones still came inside FINISHED, so it looked fine): the broker refuses its READY
// naming both prefixes, the worker logs the refusal and gets no work.
TEST_F(EndToEnd, AWorkerWithAnotherRedisPrefixIsRefused) {
  FleetOptions o{1};
  o.worker_args = {"--redis-prefix", "other:"};
  fleet_ = std::make_unique<Fleet>(o);
  ASSERT_TRUE(testutil::WaitFor(
      [&] { return fleet_->worker(0).Log().find("the broker refused it") != std::string::npos; },
      std::chrono::seconds(60)))
      << fleet_->Logs();
  EXPECT_NE(fleet_->worker(0).Log().find("READY says --redis-prefix \"other:\", the broker's is "
                                         "\"ferry:\""),
            std::string::npos)
      << fleet_->Logs();
  EXPECT_TRUE(fleet_->WaitForWorkers(0, std::chrono::seconds(5))) << fleet_->Logs();
}

// A worker has nothing to reload: a SIGHUP (a closed ssh session, a `kill -HUP` meant for the
// broker's keys) is logged and ignored, and the worker goes on running jobs. Before, SIGHUP's
// default action ended it without a drain or a word.
TEST_F(EndToEnd, AWorkerLogsAndIgnoresSighup) {
  StartFleet(FleetOptions{1});
  fleet_->worker(0).Signal(SIGHUP);
  ASSERT_TRUE(testutil::WaitFor(
      [&] {
        return fleet_->worker(0).Log().find("SIGHUP: nothing to reload") != std::string::npos;
      },
      std::chrono::seconds(20)))
      << fleet_->Logs();
  EXPECT_TRUE(fleet_->worker(0).Running());
  const std::vector<Result> results = RunAll(*client_, {TinyJob(3)}, *fleet_);
  EXPECT_EQ(results.at(0).state, JobState::kDone) << results[0].error.ToString();
}

TEST_F(EndToEnd, ManyProducerThreadsShareOneClient) {
  StartFleet(FleetOptions{2});
  std::atomic<int> done{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        Job j = TinyJob(1000 * t + i);
        std::string id;
        Result r;
        if (!client_->Submit(j, &id).ok() || !client_->Wait(id, 30000, &r).ok() ||
            r.state != JobState::kDone) {
          ++bad;
          continue;
        }
        auto expected = testutil::RunReference(testutil::ModelPath("tiny"), j.inputs);
        if (testutil::MaxAbsDiff(r.outputs[0], expected[0]) < 1e-5)
          ++done;
        else
          ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), 200);
  EXPECT_EQ(bad.load(), 0);
}

// The broker refuses a SUBMIT of more jobs, or a CANCEL of more ids, than its
// --max-jobs-per-message (10,000 by default) as a whole: SubmitMany and CancelMany split theirs.
TEST_F(EndToEnd, SubmitManyAndCancelManySplitPastTenThousandJobs) {
  StartFleet(FleetOptions{1});
  const size_t n = protocol::kMaxJobsPerMessage + 1;
  std::vector<Job> jobs;
  for (size_t i = 0; i < n; ++i) {
    jobs.push_back(TinyJob(static_cast<uint32_t>(i % 7)));
    jobs.back().id = "split-" + std::to_string(i);
  }
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client_->SubmitMany(jobs, &outcomes).ok());
  ASSERT_EQ(outcomes.size(), n);
  std::vector<std::string> ids;
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.id << ": " << o.status.ToString();
    ids.push_back(o.id);
  }
  client::CancelReport report;
  ASSERT_TRUE(client_->CancelMany(ids, &report).ok());
  EXPECT_EQ(report.cancelled.size() + report.running.size() + report.not_found.size(), n);
  Result last;
  ASSERT_TRUE(client_->Wait(ids.back(), 60000, &last).ok()) << fleet_->Logs();
  EXPECT_NE(last.state, JobState::kPending);
}

// Whether the broker's STATS come to count no job pending (within 60 s).
bool NothingPending(Client& c) {
  return testutil::WaitFor(
      [&] {
        std::string stats;
        return c.Stats(&stats).ok() && stats.find("\"pending\":0,") != std::string::npos;
      },
      std::chrono::seconds(60));
}

// A batch of more jobs than a body's map may hold (4,096: the decoders' limit) is reported in
// several DONE messages, each with its ids' inline results: the broker hears of every job
// (pending back to 0) and every result is right. One undecodable DONE used to leave thousands
// of jobs running at the broker for good.
TEST_F(EndToEnd, ABatchOfMoreThan4096JobsIsReportedWhole) {
  FleetOptions o{1};
  o.max_batch = 8192;
  o.worker_args = {"--instances", "1"};
  StartFleet(o);
  auto c = Connect(*fleet_, /*push_results=*/false);  // records inline in DONE, not notices
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 8192; ++i) jobs.push_back(TinyJob(i % 11));
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
  EXPECT_TRUE(NothingPending(*c)) << "the broker still counts jobs as running\n" << fleet_->Logs();
  size_t biggest = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    Result r;
    ASSERT_TRUE(c->Poll(outcomes[i].id, &r).ok());
    ASSERT_EQ(r.state, JobState::kDone) << i << " " << r.error.ToString();
    biggest = std::max(biggest, static_cast<size_t>(r.batch_size));
    if (i < 11) {
      auto expected = testutil::RunReference(testutil::ModelPath("tiny"), jobs[i].inputs);
      EXPECT_LT(testutil::MaxAbsDiff(r.outputs.at(0), expected[0]), 1e-5) << i;
    }
  }
  EXPECT_GT(biggest, protocol::kMaxMapEntries) << "no batch was big enough to test this";
}

// The same batch when every job's result is already in Redis: each write is a duplicate, and the
// worker's several DONEs report them all, each no more than its own ids (the broker caps a
// DONE's claim there). Before, the first DONE claimed all 8,192 and the broker counted 4,096.
TEST_F(EndToEnd, DuplicatesOfABatchReportedInSeveralDonesAreAllCounted) {
  FleetOptions o{1};
  o.max_batch = 8192;
  o.worker_args = {"--instances", "1"};
  StartFleet(o);
  auto c = Connect(*fleet_, /*push_results=*/false);
  auto redis = fleet_->redis().Connect();
  ASSERT_TRUE(redis);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 8192; ++i) {
    jobs.push_back(TinyJob(i % 11));
    jobs.back().id = "dup-" + std::to_string(i);
    redis->Append({"SET", protocol::Keys().Result(jobs.back().id), "an earlier result"});
  }
  std::vector<protocol::RedisReply> replies;
  ASSERT_TRUE(redis->Flush(&replies).ok());
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
  for (const auto& outcome : outcomes)
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.ToString();
  EXPECT_TRUE(NothingPending(*c)) << fleet_->Logs();
  std::string stats;
  ASSERT_TRUE(c->Stats(&stats).ok());
  EXPECT_NE(stats.find("\"duplicates\":8192"), std::string::npos) << stats;
  // One chunk of the 8,192: one batch, whose report the worker had to split.
  EXPECT_TRUE(stats.find("\"chunks\":1,") != std::string::npos ||
              stats.find("\"chunks\":1}") != std::string::npos)
      << "the jobs went in several chunks: nothing to split\n"
      << stats;
}

// A batch whose inline results outweigh both what the broker takes from producers in one
// message (--max-message-bytes, 1 MiB here) and what one DONE should carry (8 MiB): the worker
// splits its DONE by bytes too, and the broker takes workers' messages of at least 72 MiB
// whatever the producers' limit. A DONE over the limit used to be dropped with the worker's
// connection: the broker requeued its jobs and they all ran again (their second results fenced
// as duplicates), each big batch twice.
TEST_F(EndToEnd, InlineResultsOverTheMessageLimitAreReportedWhole) {
  constexpr uint32_t kJobs = 96;
  constexpr int64_t kFloats = 262144;  // 1 MiB in (stored in Redis by the SDK) and out (inline)
  FleetOptions o{1};
  o.models = {"null"};
  o.max_batch = kJobs;
  o.broker_args = {"--max-message-bytes", "1048576"};
  o.worker_args = {"--instances", "1", "--inline-result-bytes", "2097152"};
  StartFleet(o);
  auto c = Connect(*fleet_, /*push_results=*/false);  // records inline in DONE, not notices
  std::vector<Job> jobs(kJobs);
  for (uint32_t i = 0; i < kJobs; ++i) {
    jobs[i].model = "null";
    jobs[i].inputs = {Tensor::From<float>(std::vector<float>(kFloats, static_cast<float>(i)),
                                          {kFloats}, DType::kFloat32)};
  }
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
  EXPECT_TRUE(NothingPending(*c)) << "the broker still counts jobs as running\n" << fleet_->Logs();
  std::string stats;
  ASSERT_TRUE(c->Stats(&stats).ok());
  for (const char* counter : {"\"requeued\":", "\"duplicates\":"}) {
    const size_t at = stats.find(counter);
    ASSERT_NE(at, std::string::npos) << stats;
    EXPECT_EQ(std::stoll(stats.substr(at + std::strlen(counter))), 0)
        << counter << " the jobs ran more than once: " << stats << "\n"
        << fleet_->Logs();
  }
  int64_t biggest = 0;
  for (uint32_t i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    Result r;
    ASSERT_TRUE(c->Wait(outcomes[i].id, 30000, &r).ok()) << fleet_->Logs();
    ASSERT_EQ(r.state, JobState::kDone) << i << " " << r.error.ToString();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << i;
    biggest = std::max(biggest, r.batch_size);
  }
  EXPECT_GT(biggest * kFloats * 4, protocol::kMinWorkerMessageBytes)
      << "no batch's records were big enough to test this";
}

}  // namespace
}  // namespace ferry::end_to_end_test
