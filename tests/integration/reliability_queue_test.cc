// The broker's queue on real processes (docs/reliability.md): it is bounded (overload is
// rejected `queue_full` and the broker's memory stays bounded), jobs not started within their
// timeout expire without running, queued and dispatched jobs can be cancelled, and higher
// priorities run first, FIFO within one. ctest runs them twice, like every reliability test: as
// they are, and as curve.* with FERRY_TEST_CURVE=1.
#include <gtest/gtest.h>
#include <signal.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferry/metrics/names.h"
#include "fleet.h"
#include "metrics_scraper.h"
#include "process.h"
#include "reliability_fixture.h"

// GCC says -fsanitize=address with __SANITIZE_ADDRESS__, clang (before 17) with __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FERRY_TEST_ASAN 1
#endif

namespace ferry::reliability_test {
namespace {

// Resident set size of a process, from /proc.
TEST(Reliability, OverloadIsRejectedWithQueueFullAndBrokerMemoryStaysBounded) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = Concat(kFastHeartbeats, {"--max-queue", "200"});
  fo.worker_args = kFastHeartbeats;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  // Freeze the only worker: the broker drops it, the model stays known, nothing drains.
  fleet.worker(0).Signal(SIGSTOP);
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  // The bytes go through the broker (attached: the client stores nothing in Redis), which
  // must keep only what it accepted.
  auto c = MakeClient(fleet, 5000, /*stored_input_bytes=*/0);
  const int64_t rss_before = testutil::RssBytes(fleet.broker().pid());
  // 10x the queue bound, 64 KiB each: 128 MiB offered, 12.5 MiB can be kept.
  std::vector<float> payload(16384, 0.25f);
  int accepted = 0, queue_full = 0;
  std::vector<std::string> accepted_ids;
  for (int b = 0; b < 20; ++b) {
    std::vector<Job> jobs;
    for (int i = 0; i < 100; ++i) {
      Job j;
      j.id = "over-" + std::to_string(b * 100 + i);
      j.model = "null";
      j.inputs.push_back(Tensor::From<float>(payload, {16384}, DType::kFloat32));
      jobs.push_back(std::move(j));
    }
    std::vector<SubmitOutcome> outcomes;
    ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
    for (const auto& o : outcomes) {
      if (o.status.ok()) {
        ++accepted;
        accepted_ids.push_back(o.id);
      } else {
        ASSERT_EQ(o.status.code(), codes::kQueueFull) << o.status.ToString();
        ASSERT_TRUE(o.status.retryable());
        ++queue_full;
      }
    }
  }
  EXPECT_EQ(accepted, 200);
  EXPECT_EQ(queue_full, 1800);
#ifndef FERRY_TEST_ASAN  // AddressSanitizer's quarantine keeps freed memory: RSS says nothing
  const int64_t rss_after = testutil::RssBytes(fleet.broker().pid());
  ASSERT_GT(rss_before, 0);
  // What it keeps is 200 x 64 KiB (x2 with the journal's copy in flight, plus one received
  // SUBMIT of 6.4 MiB); far below 128 MiB.
  EXPECT_LT(rss_after - rss_before, 48ll << 20) << rss_before << " -> " << rss_after;
#else
  (void)rss_before;
#endif
  // Thaw the worker: it reconnects, and every accepted job completes.
  fleet.worker(0).Signal(SIGCONT);
  const auto results = WaitAll(*c, accepted_ids, 60000);
  for (const auto& [id, r] : results) EXPECT_EQ(r.state, JobState::kDone) << id;
}

// Inputs the producer stored in Redis count against the broker's --max-pending-bytes by their
// size (dtype x shape), though the broker never holds them: past it SUBMIT rejects with
// `queue_full`, and the client deletes the stored inputs of the jobs the broker rejected.
TEST(Reliability, StoredInputsCountAgainstThePendingBytesAndRejectedOnesAreDeleted) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = Concat(kFastHeartbeats, {"--max-pending-bytes", "1100000"});
  fo.worker_args = kFastHeartbeats;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  fleet.worker(0).Signal(SIGSTOP);  // nothing drains (the broker drops it, the model stays known)
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  auto c = MakeClient(fleet);  // stores inputs of 64 KiB and more
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i)  // 200,000 bytes each: stored in Redis
    jobs.push_back(BigNullJob("pend-" + std::to_string(i), 0.5f + i));
  std::vector<SubmitOutcome> outcomes;
  c->SubmitMany(jobs, &outcomes);
  std::vector<std::string> accepted;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i].status.ok()) {
      accepted.push_back(outcomes[i].id);
      continue;
    }
    EXPECT_EQ(outcomes[i].status.code(), codes::kQueueFull) << outcomes[i].status.ToString();
    EXPECT_NE(outcomes[i].status.message().find("pending input bytes"), std::string::npos)
        << outcomes[i].status.ToString();
  }
  ASSERT_EQ(accepted.size(), 5u)
      << "five jobs of 200,000 bytes (and their small records) fit in 1,100,000";
  EXPECT_TRUE(WaitFor([&] { return InputKeys(fleet) == 5; }))
      << InputKeys(fleet) << " input keys: the rejected jobs' were not deleted";
  fleet.worker(0).Signal(SIGCONT);
  const auto results = WaitAll(*c, accepted, 60000);
  for (const auto& [id, r] : results) EXPECT_EQ(r.state, JobState::kDone) << id;
  EXPECT_TRUE(WaitFor([&] { return InputKeys(fleet) == 0; })) << InputKeys(fleet) << " left";
}

TEST(Reliability, JobNotStartedWithinItsTimeoutExpiresAndNeverRuns) {
  Fleet fleet(OneSlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("blocker", 3000), &id).ok());  // seconds
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    Job j = SlowJob("short-deadline-" + std::to_string(i), 1);
    j.timeout_ms = 200;
    ASSERT_TRUE(c->Submit(j, &id).ok());
    ids.push_back(id);
  }
  Job patient = SlowJob("patient", 1);
  patient.timeout_ms = 60000;
  ASSERT_TRUE(c->Submit(patient, &id).ok());
  for (const auto& [i, r] : WaitAll(*c, ids, 30000)) {
    EXPECT_EQ(r.state, JobState::kExpired) << i;
    EXPECT_EQ(r.error.code(), codes::kExpired) << i;
    EXPECT_EQ(r.timing_us.count("compute_start"), 0u) << i << " never reached the model";
  }
  Result r;
  ASSERT_TRUE(c->Wait("patient", 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
  ASSERT_TRUE(c->Wait("blocker", 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
}

TEST(Reliability, CancelQueuedAndDispatchedJobs) {
  Fleet fleet(OneSlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("running", 4000), &id).ok());  // seconds on the executor
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c->Submit(SlowJob("victim-" + std::to_string(i), 1), &id).ok());
    ids.push_back(id);
  }
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << "victim-0 is on the worker";
  client::CancelReport report;
  std::vector<std::string> to_cancel = ids;
  to_cancel.push_back("never-submitted");
  ASSERT_TRUE(c->CancelMany(to_cancel, &report).ok());
  EXPECT_EQ(report.running, std::vector<std::string>({"victim-0"}));
  EXPECT_EQ(report.cancelled,
            std::vector<std::string>({"victim-1", "victim-2", "victim-3", "victim-4"}));
  EXPECT_EQ(report.not_found, std::vector<std::string>({"never-submitted"}));
  for (const auto& [i, r] : WaitAll(*c, ids, 30000)) {
    EXPECT_EQ(r.state, JobState::kCancelled) << i << " " << JobStateName(r.state);
    EXPECT_EQ(r.timing_us.count("compute_start"), 0u) << i;
  }
  Result r;
  ASSERT_TRUE(c->Wait("running", 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone) << "a job whose batch started runs to the end";
  // Finished jobs are not found. (Wait may return from the worker's result notice up to ~2 ms
  // before the broker has the job's DONE: until then the broker still counts it as running.)
  EXPECT_TRUE(WaitFor([&] { return c->Cancel("running").code() == codes::kNotFound; }))
      << fleet.Logs();
  // The CLI says the same.
  testutil::TempDir dir;
  const std::string cmd = testutil::CliBin() + " cancel --frontend " + fleet.frontend() +
                          fleet.CurveCliFlags() + " --redis " + fleet.redis().url() +
                          " running > " + dir.path() + "/out.txt 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1);
  EXPECT_EQ(testutil::ReadFile(dir.path() + "/out.txt"), "not_found running\n");
}

// A job the broker finishes itself (here cancelled while queued) lets go of its input bytes at
// once, also while Redis is down and its `cancelled` result waits in the broker to be written:
// without the journal the bytes are held nowhere else, and a broker holding them until Redis is
// back would grow with every job cancelled, expired or failed meanwhile. The results are
// written once Redis is back. 40 MB inputs: glibc gives an allocation over 32 MiB its own
// mapping and unmaps it on free, so the broker's RSS shows the release.
TEST(Reliability, JobsTheBrokerFinishesLetGoOfTheirInputsWhileRedisIsDown) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = Concat(kFastHeartbeats, {"--no-journal"});
  fo.worker_args = kFastHeartbeats;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  // Freeze the only worker: the broker drops it, the model stays known, the jobs stay queued.
  fleet.worker(0).Signal(SIGSTOP);
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  auto c = MakeClient(fleet, 30000, /*stored_input_bytes=*/0);  // the bytes go through the broker
  fleet.redis().Stop();
  const int64_t rss_before = testutil::RssBytes(fleet.broker().pid());
  constexpr int kJobs = 3;
  const std::vector<float> payload(10'000'000, 0.5f);  // 40 MB
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    Job j;
    j.id = "held-" + std::to_string(i);
    j.model = "null";
    j.inputs.push_back(Tensor::From<float>(payload, {10'000'000}, DType::kFloat32));
    ASSERT_TRUE(c->Submit(j, nullptr).ok()) << fleet.Logs();
    ids.push_back(j.id);
  }
  const int64_t rss_held = testutil::RssBytes(fleet.broker().pid());
  client::CancelReport report;
  ASSERT_TRUE(c->CancelMany(ids, &report).ok()) << fleet.Logs();
  EXPECT_EQ(report.running, ids);  // not final while Redis cannot take their results
  const int64_t rss_after = testutil::RssBytes(fleet.broker().pid());
#ifndef FERRY_TEST_ASAN  // AddressSanitizer's quarantine keeps freed memory: RSS says nothing
  ASSERT_GT(rss_before, 0);
  EXPECT_GT(rss_held - rss_before, 100ll << 20) << "the broker did not hold the inputs";
  EXPECT_LT(rss_after - rss_before, 40ll << 20)
      << rss_before << " -> " << rss_held << " -> " << rss_after;
#else
  (void)rss_held;
  (void)rss_after;
#endif
  fleet.redis().Restart();
  const auto results = WaitAll(*c, ids, 60000);
  for (const auto& [id, r] : results)
    EXPECT_EQ(r.state, JobState::kCancelled) << id << " " << r.error.ToString() << fleet.Logs();
  fleet.worker(0).Signal(SIGCONT);
}

// Without the journal the broker accepts jobs while Redis is down, and the results it writes
// itself (here `cancelled`) wait in it until Redis is back. They are bounded: once --max-queue of
// them wait, a SUBMIT's jobs are rejected `unavailable` (retry later), and accepted again once
// Redis has taken them. Before, they grew for as long as Redis stayed down.
TEST(Reliability, TheResultsABrokerWithoutJournalKeepsForRedisAreBounded) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"null"};
  fo.broker_args = Concat(kFastHeartbeats, {"--no-journal", "--max-queue", "3"});
  fo.worker_args = kFastHeartbeats;
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  // Freeze the only worker: the broker drops it, the model stays known, the jobs stay queued.
  fleet.worker(0).Signal(SIGSTOP);
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  auto c = MakeClient(fleet, 30000);
  fleet.redis().Stop();
  auto job = [](const std::string& id) {
    Job j;
    j.id = id;
    j.model = "null";
    j.inputs.push_back(Tensor::From<float>(std::vector<float>(4, 1.0f), {4}, DType::kFloat32));
    return j;
  };
  const std::vector<std::string> ids = {"waits-0", "waits-1", "waits-2"};
  for (const auto& id : ids) ASSERT_TRUE(c->Submit(job(id), nullptr).ok()) << fleet.Logs();
  client::CancelReport report;
  ASSERT_TRUE(c->CancelMany(ids, &report).ok()) << fleet.Logs();
  EXPECT_EQ(report.running, ids);  // their results wait in the broker
  Status s = c->Submit(job("one-too-many"), nullptr);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("wait for Redis"), std::string::npos) << s.ToString();
  fleet.redis().Restart();
  for (const auto& [id, r] : WaitAll(*c, ids, 60000))
    EXPECT_EQ(r.state, JobState::kCancelled) << id << " " << r.error.ToString() << fleet.Logs();
  s = c->Submit(job("one-too-many"), nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString() << fleet.Logs();
  fleet.worker(0).Signal(SIGCONT);
  Result r;
  EXPECT_TRUE(c->Wait("one-too-many", 60000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
}

// A queued job cancelled while Redis is down cannot get its `cancelled` result in Redis before
// CANCELLED goes out: it is reported `running` (not final yet, the result tells), not
// `cancelled`, since a broker that died before Redis came back would restore it from its
// journal and run it; the lists keep the request's order. This broker lives: once Redis is back
// it writes `cancelled`, and the worker drops the other job, which it held unstarted. The
// broker's metrics count the job finished only then, too.
TEST(Reliability, AJobCancelledWhileRedisIsDownIsNotFinalUntilRedisTakesItsResult) {
  const int metrics_port = testutil::FreePort();
  FleetOptions fo = OneSlowLane();
  fo.broker_args = {"--metrics-port", std::to_string(metrics_port)};
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("busy", 4000), &id).ok());  // seconds on the executor
  ASSERT_TRUE(c->Submit(SlowJob("on-the-worker", 1), &id).ok());
  ASSERT_TRUE(c->Submit(SlowJob("at-the-broker", 1), &id).ok());
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << "on-the-worker is held";
  fleet.redis().Stop();
  client::CancelReport report;
  ASSERT_TRUE(c->CancelMany({"at-the-broker", "on-the-worker"}, &report).ok()) << fleet.Logs();
  EXPECT_TRUE(report.cancelled.empty());
  EXPECT_EQ(report.running, (std::vector<std::string>{"at-the-broker", "on-the-worker"}));
  testutil::Scraper broker{testutil::Url(metrics_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_EQ(broker.Sum(metrics::names::kJobsFinished), 0) << "no result is in Redis yet";
  fleet.redis().Restart();
  for (const auto& [i, r] : WaitAll(*c, {"at-the-broker", "on-the-worker"}, 60000)) {
    EXPECT_EQ(r.state, JobState::kCancelled) << i << " " << r.error.ToString() << fleet.Logs();
    EXPECT_EQ(r.timing_us.count("compute_start"), 0u) << i;
  }
  // One cancelled by the broker, one by the worker (reported in its DONE).
  EXPECT_TRUE(broker.WaitFor(metrics::names::kJobsFinished, {{"status", "cancelled"}}, 2))
      << broker.Sum(metrics::names::kJobsFinished, {{"status", "cancelled"}}) << fleet.Logs();
}

TEST(Reliability, HigherPriorityRunsFirstFifoWithin) {
  Fleet fleet(OneSlowLane());
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("blocker", 3000), &id).ok());  // seconds
  ASSERT_TRUE(c->Submit(SlowJob("filler", 1), &id).ok());      // the worker's second slot
  const pid_t pid = fleet.worker(0).pid();
  ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 2; })) << fleet.Logs();
  // Interleaved low and high: all wait at the broker.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    for (int64_t p : {0, 5}) {
      ASSERT_TRUE(
          c->Submit(SlowJob("p" + std::to_string(p) + "-" + std::to_string(i), 1, p), &id).ok());
      ids.push_back(id);
    }
  }
  std::vector<std::pair<int64_t, std::string>> by_start;
  for (const auto& [i, r] : WaitAll(*c, ids, 30000)) {
    ASSERT_EQ(r.state, JobState::kDone) << i;
    by_start.emplace_back(r.timing_us.at("compute_start"), i);
  }
  std::sort(by_start.begin(), by_start.end());
  std::vector<std::string> order;
  for (const auto& [t, i] : by_start) order.push_back(i);
  EXPECT_EQ(order, std::vector<std::string>({"p5-0", "p5-1", "p5-2", "p0-0", "p0-1", "p0-2"}));
}

// The broker and its workers need not heartbeat alike: each says its interval (a worker in
// READY, the broker in its HEARTBEATs), and neither presumes the other dead before --liveness of
// the longer one. A broker at 100 ms with a worker at 1 s, then the other way round, each
// watched for 3 s (ten times the 300 ms that the faster side's own liveness allows): nobody is
// dropped or reconnects, and jobs run. Before, the broker dropped the slower worker as silent
// every 300 ms (its jobs requeued, then poisoned), or the faster worker kept reconnecting to
// the slower broker.
TEST(Reliability, ABrokerAndAWorkerHeartbeatingAtDifferentRatesKeepEachOther) {
  const std::vector<std::string> slow = {"--heartbeat-ms", "1000", "--liveness", "3"};
  for (const bool broker_faster : {true, false}) {
    SCOPED_TRACE(broker_faster ? "broker 100 ms, worker 1 s" : "broker 1 s, worker 100 ms");
    FleetOptions fo;
    fo.workers = 1;
    fo.models = {"slow"};
    fo.broker_args = broker_faster ? kFastHeartbeats : slow;
    fo.worker_args = broker_faster ? slow : kFastHeartbeats;
    Fleet fleet(fo);
    ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
    auto c = MakeClient(fleet, 30000);
    Result r;
    ASSERT_TRUE(c->Run(SlowJob("", 1), 30000, &r).ok()) << fleet.Logs();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ASSERT_TRUE(c->Run(SlowJob("", 1), 30000, &r).ok()) << fleet.Logs();
    EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
    EXPECT_EQ(fleet.broker().Log().find("removed (silent)"), std::string::npos) << fleet.Logs();
    EXPECT_EQ(fleet.worker(0).Log().find("silent for"), std::string::npos) << fleet.Logs();
  }
}

}  // namespace
}  // namespace ferry::reliability_test
