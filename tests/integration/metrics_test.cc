// The broker's and the worker's /metrics on a real fleet: redis-server, ferry-broker and
// ferry-worker processes with --metrics-port on free ports, jobs through the SDK, then both
// endpoints scraped and their counters checked against what was sent. Also --log-json lines.
#include <gtest/gtest.h>

#include <sstream>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/text_format.h"
#include "fleet.h"
#include "json.h"
#include "reference.h"

namespace ferry {
namespace {

namespace names = metrics::names;
using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;

struct Scraper {
  std::string url;
  metrics::ParsedText last;
  bool Scrape() {
    std::string body;
    if (!metrics::HttpGet(url, 2000, &body).ok()) return false;
    last = metrics::ParsedText();
    return metrics::ParseText(body, &last).ok();
  }
  double Sum(const std::string& name, const std::map<std::string, std::string>& match = {}) {
    return metrics::SumSamples(last, name, match);
  }
  // Scrapes until `name`{match} == value (true) or 30 s pass (false; `last` is the last scrape).
  bool WaitFor(const std::string& name, const std::map<std::string, std::string>& match,
               double value) {
    return testutil::WaitFor([&] { return Scrape() && Sum(name, match) == value; });
  }
};

std::string Url(int port, const std::string& path) {
  return "http://127.0.0.1:" + std::to_string(port) + path;
}

Job TinyJob(uint32_t seed, std::vector<int64_t> shape = {8}) {
  Job j;
  j.model = "tiny";
  j.inputs = {testutil::RandomFloats(shape, seed)};
  return j;
}

// Every non-empty line of a log written with --log-json is one JSON object with ts/level/msg.
void ExpectJsonLines(const std::string& log, const std::string& component,
                     std::vector<std::string>* messages) {
  std::istringstream in(log);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    cli::JsonValue v;
    ASSERT_TRUE(cli::ParseJson(line, &v).ok()) << "not JSON: " << line;
    ASSERT_EQ(v.type, cli::JsonValue::Type::kObject) << line;
    EXPECT_FALSE(v["ts"].StringOr("").empty()) << line;
    EXPECT_FALSE(v["level"].StringOr("").empty()) << line;
    EXPECT_EQ(v["component"].StringOr(""), component) << line;
    EXPECT_EQ(v["msg"].type, cli::JsonValue::Type::kString) << line;
    messages->push_back(v["msg"].StringOr(""));
    ++n;
  }
  EXPECT_GT(n, 0) << "no log lines";
}

TEST(Metrics, CountersMatchTheJobsSentOnBothEndpoints) {
  const int broker_port = testutil::FreePort();
  const int worker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.max_batch = 8;
  o.broker_args = {"--metrics-port", std::to_string(broker_port), "--log-json"};
  o.worker_args = {
      "--metrics-port", std::to_string(worker_port), "--log-json", "--log-level", "debug", "--name",
      "metrics-worker"};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  Scraper broker{Url(broker_port, "/metrics")};
  Scraper worker{Url(worker_port, "/metrics")};

  std::string health;
  ASSERT_TRUE(metrics::HttpGet(Url(broker_port, "/healthz"), 2000, &health).ok());
  EXPECT_EQ(health, "ok\n");
  ASSERT_TRUE(metrics::HttpGet(Url(worker_port, "/healthz"), 2000, &health).ok());
  EXPECT_EQ(health, "ok\n");
  ASSERT_TRUE(broker.WaitFor(names::kWorkersConnected, {}, 1)) << fleet.Logs();
  EXPECT_GT(broker.Sum(names::kWorkerCredit, {{"worker", "metrics-worker"}}), 0);

  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());

  // N good jobs in one SUBMIT, all done.
  constexpr int kJobs = 100;
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < kJobs; ++i) jobs.push_back(TinyJob(i));
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
  for (const auto& out : outcomes) {
    ASSERT_TRUE(out.status.ok()) << out.status.ToString();
    Result r;
    ASSERT_TRUE(c->Wait(out.id, 60000, &r).ok()) << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
  }
  // One the model raises on (wrong width): failed on the worker.
  std::string bad_id;
  ASSERT_TRUE(c->Submit(TinyJob(7, {3}), &bad_id).ok());
  Result bad;
  ASSERT_TRUE(c->Wait(bad_id, 60000, &bad).ok()) << fleet.Logs();
  ASSERT_EQ(bad.state, JobState::kFailed);
  // One rejected: no worker serves the model.
  Job unknown = TinyJob(1);
  unknown.model = "no-such-model";
  Status s = c->Submit(unknown, nullptr);
  ASSERT_EQ(s.code(), codes::kUnknownModel) << s.ToString();

  // The broker: DONE can reach it a moment after the client read the result.
  const std::map<std::string, std::string> tiny = {{"model", "tiny"}};
  ASSERT_TRUE(broker.WaitFor(names::kJobsFinished, {{"model", "tiny"}, {"status", "failed"}}, 1))
      << broker.Sum(names::kJobsFinished, {{"status", "failed"}}) << fleet.Logs();
  ASSERT_TRUE(broker.WaitFor(names::kJobsPending, {}, 0)) << fleet.Logs();
  EXPECT_EQ(broker.Sum(names::kJobsAccepted, tiny), kJobs + 1);
  EXPECT_EQ(broker.Sum(names::kJobsAccepted), kJobs + 1);
  EXPECT_EQ(broker.Sum(names::kJobsRejected, {{"code", "unknown_model"}}), 1);
  EXPECT_EQ(broker.Sum(names::kJobsRejected), 1);
  EXPECT_EQ(broker.Sum(names::kJobsFinished, {{"model", "tiny"}, {"status", "done"}}), kJobs);
  EXPECT_EQ(broker.Sum(names::kJobsFinished), kJobs + 1);
  EXPECT_EQ(broker.Sum(names::kJobsDispatched, tiny), kJobs + 1);
  EXPECT_GE(broker.Sum(names::kChunksDispatched), (kJobs + 7) / 8 + 1);
  EXPECT_EQ(broker.Sum(names::kJobsRequeued), 0);
  EXPECT_EQ(broker.Sum(names::kDuplicatesSuppressed), 0);
  EXPECT_EQ(broker.Sum(std::string(names::kJobLatency) + "_count", tiny), kJobs + 1);
  EXPECT_EQ(broker.Sum(std::string(names::kJobQueueTime) + "_count", tiny), kJobs + 1);
  EXPECT_GT(broker.Sum(std::string(names::kJobLatency) + "_sum", tiny), 0);
  EXPECT_EQ(
      broker.Sum(names::kJobLatency + std::string("_bucket"), {{"model", "tiny"}, {"le", "+Inf"}}),
      kJobs + 1);
  EXPECT_EQ(broker.Sum(names::kQueueDepth, tiny), 0);
  EXPECT_EQ(broker.Sum(names::kQueueOldestAge, tiny), 0);
  EXPECT_EQ(broker.Sum(names::kWorkerInFlight, {{"worker", "metrics-worker"}}), 0);
  EXPECT_EQ(broker.Sum(names::kBuildInfo, {{"component", "broker"}}), 1);
  EXPECT_GT(broker.Sum(names::kProcessStartTime), 0);
  EXPECT_EQ(broker.last.types[names::kJobsAccepted], "counter");
  EXPECT_EQ(broker.last.types[names::kQueueDepth], "gauge");
  EXPECT_EQ(broker.last.types[names::kJobLatency], "histogram");

  // The worker: the result writer counts after the write, so poll too.
  ASSERT_TRUE(worker.WaitFor(names::kWorkerJobs, {{"model", "tiny"}, {"status", "failed"}}, 1))
      << fleet.Logs();
  EXPECT_EQ(worker.Sum(names::kWorkerJobs, {{"model", "tiny"}, {"status", "done"}}), kJobs);
  EXPECT_EQ(worker.Sum(names::kWorkerJobs), kJobs + 1);
  const double batches = worker.Sum(names::kBatches, tiny);
  EXPECT_GE(batches, (kJobs + 7) / 8 + 1);
  EXPECT_EQ(worker.Sum(std::string(names::kBatchSize) + "_count", tiny), batches);
  EXPECT_EQ(worker.Sum(std::string(names::kBatchSize) + "_sum", tiny), kJobs + 1);
  EXPECT_EQ(worker.Sum(std::string(names::kJobComputeTime) + "_count", tiny), kJobs + 1);
  EXPECT_GT(worker.Sum(names::kExecutorBusy), 0);
  EXPECT_EQ(worker.Sum(names::kExecutors), 1);
  EXPECT_EQ(worker.Sum(names::kModelResident, tiny), 1);
  EXPECT_EQ(worker.Sum(names::kModelsResident), 1);
  EXPECT_EQ(worker.Sum(names::kWorkerInfo, {{"worker", "metrics-worker"}, {"device", "cpu"}}), 1);
  EXPECT_EQ(worker.Sum(names::kDeviceMemoryBudget), 0);
  EXPECT_GT(worker.Sum(names::kDeviceMemoryUsed), 0);  // CPU: the resident models' bytes
  EXPECT_EQ(worker.Sum(names::kDuplicatesSuppressed), 0);
  EXPECT_EQ(worker.Sum(names::kResultWriteErrors), 0);
  EXPECT_EQ(worker.Sum(names::kBuildInfo, {{"component", "worker"}}), 1);

  // --log-json: every line of both logs is a JSON object; the worker logged its batches.
  std::vector<std::string> broker_msgs, worker_msgs;
  ExpectJsonLines(fleet.broker().Log(), "broker", &broker_msgs);
  ExpectJsonLines(fleet.worker(0).Log(), "worker", &worker_msgs);
  bool batch_line = false;
  for (const auto& m : worker_msgs)
    batch_line = batch_line ||
                 (m.find("batch ") != std::string::npos &&
                  m.find("worker metrics-worker device cpu model tiny size") != std::string::npos);
  EXPECT_TRUE(batch_line) << fleet.worker(0).Log();

  // A second broker on the same metrics port fails to start (exit 1) instead of sharing it.
  testutil::TempDir dir;
  testutil::Process second(
      {testutil::BrokerBin(), "--frontend",
       "tcp://127.0.0.1:" + std::to_string(testutil::FreePort()), "--backend",
       "tcp://127.0.0.1:" + std::to_string(testutil::FreePort()), "--redis", fleet.redis().url(),
       "--no-journal", "--metrics-port", std::to_string(broker_port)},
      dir.path() + "/second.log");
  EXPECT_EQ(second.Wait(), 1) << second.Log();
}

}  // namespace
}  // namespace ferry
