// The broker's and the worker's /metrics on a real fleet: redis-server, ferry-broker and
// ferry-worker processes with --metrics-port on free ports, jobs through the SDK, then both
// endpoints scraped and their counters checked against what was sent. Also --log-json lines
// and their job_id/model/worker fields, text-mode lines, /healthz with Redis down, the process_*
// and Redis metrics, and jobs of a model whose workers left (--orphan-timeout-s).
#include <gtest/gtest.h>

#include <csignal>
#include <functional>
#include <sstream>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/text_format.h"
#include "ferry/protocol/keys.h"
#include "fleet.h"
#include "json.h"
#include "metrics_scraper.h"
#include "raw_wire.h"
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
using testutil::Scraper;
using testutil::TinyJob;
using testutil::Url;

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
  // Each process probes Redis on a thread of its own: ready once the first probe answered.
  for (int port : {broker_port, worker_port}) {
    for (const char* path : {"/livez", "/healthz", "/readyz"}) {
      ASSERT_TRUE(testutil::WaitFor([&] {
        return metrics::HttpGet(Url(port, path), 2000, &health).ok();
      })) << path
          << fleet.Logs();
      EXPECT_EQ(health, "ok\n");
    }
  }
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
  // The failed job's line carries the ids to follow it by.
  bool fields = false;
  std::istringstream worker_log(fleet.worker(0).Log());
  for (std::string line; std::getline(worker_log, line);) {
    cli::JsonValue v;
    if (!cli::ParseJson(line, &v).ok() || v["job_id"].StringOr("") != bad_id) continue;
    EXPECT_EQ(v["model"].StringOr(""), "tiny") << line;
    EXPECT_EQ(v["worker"].StringOr(""), "metrics-worker") << line;
    fields = true;
  }
  EXPECT_TRUE(fields) << "no line with job_id " << bad_id << ": " << fleet.worker(0).Log();
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
  EXPECT_NE(second.Log().find("--metrics-port " + std::to_string(broker_port)), std::string::npos)
      << second.Log();
}

// Redis stopped: /healthz and /readyz of both processes answer 503 with the reason, /livez
// still 200, ferry_redis_up 0; back to 200 and 1 when Redis is. The process_* metrics, the
// Redis memory gauges (broker) and /readyz of a worker that waits for its broker.
TEST(Metrics, HealthFollowsRedisAndProcessMetricsAreThere) {
  const int broker_port = testutil::FreePort();
  const int worker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.broker_args = {"--metrics-port", std::to_string(broker_port)};
  o.worker_args = {"--metrics-port", std::to_string(worker_port)};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  Scraper broker{Url(broker_port, "/metrics")};
  Scraper worker{Url(worker_port, "/metrics")};
  ASSERT_TRUE(broker.WaitFor(names::kRedisUp, {}, 1)) << fleet.Logs();
  ASSERT_TRUE(worker.WaitFor(names::kRedisUp, {}, 1)) << fleet.Logs();
  ASSERT_TRUE(testutil::WaitFor(
      [&] { return broker.Scrape() && broker.Sum(names::kRedisUsedMemory) > 0; }));
  EXPECT_EQ(broker.last.types[names::kProcessCpu], "counter");
  for (Scraper* s : {&broker, &worker}) {
    ASSERT_TRUE(s->Scrape());
    EXPECT_GT(s->Sum(names::kProcessRss), 0) << s->url;
    EXPECT_GT(s->Sum(names::kProcessOpenFds), 0) << s->url;
    EXPECT_GT(s->Sum(names::kProcessMaxFds), 0) << s->url;
    EXPECT_GT(s->Sum(names::kProcessCpu), 0) << s->url;
    EXPECT_GT(s->Sum(names::kProcessStartTime), 0) << s->url;
  }
  EXPECT_TRUE(broker.WaitFor(names::kModelWorkers, {{"model", "tiny"}}, 1));

  fleet.redis().Stop();
  std::string body;
  for (int port : {broker_port, worker_port}) {
    for (const char* path : {"/healthz", "/readyz"}) {
      Status s;
      ASSERT_TRUE(testutil::WaitFor([&] {
        s = metrics::HttpGet(Url(port, path), 2000, &body);
        return !s.ok();
      })) << path;
      EXPECT_NE(s.message().find("HTTP 503"), std::string::npos) << s.ToString();
      EXPECT_NE(s.message().find("redis://127.0.0.1:" + std::to_string(fleet.redis().port()) +
                                 " unreachable"),
                std::string::npos)
          << s.ToString();
    }
    EXPECT_TRUE(metrics::HttpGet(Url(port, "/livez"), 2000, &body).ok()) << port;
  }
  ASSERT_TRUE(broker.WaitFor(names::kRedisUp, {}, 0));
  ASSERT_TRUE(worker.WaitFor(names::kRedisUp, {}, 0));

  fleet.redis().Restart();
  for (int port : {broker_port, worker_port})
    EXPECT_TRUE(testutil::WaitFor([&] {
      return metrics::HttpGet(Url(port, "/healthz"), 2000, &body).ok();
    })) << port
        << fleet.Logs();
  EXPECT_TRUE(broker.WaitFor(names::kRedisUp, {}, 1));
}

// A worker the broker refused (here: another --redis-prefix) still hears from it, which
// answers each of its re-announces: /readyz says 503 with the broker's reason, not 200.
TEST(Metrics, AWorkerTheBrokerRefusedIsNotReady) {
  const int worker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.worker_args = {"--metrics-port", std::to_string(worker_port), "--redis-prefix", "other:"};
  Fleet fleet(o);
  ASSERT_TRUE(testutil::WaitFor(
      [&] { return fleet.worker(0).Log().find("the broker refused it") != std::string::npos; },
      std::chrono::seconds(60)))
      << fleet.Logs();
  std::string body;
  Status s = metrics::HttpGet(Url(worker_port, "/readyz"), 2000, &body);
  EXPECT_NE(s.message().find("HTTP 503"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("refused this worker: invalid_argument: READY says --redis-prefix"),
            std::string::npos)
      << s.ToString();
  EXPECT_TRUE(metrics::HttpGet(Url(worker_port, "/healthz"), 2000, &body).ok()) << fleet.Logs();
}

// A model whose only worker left: SUBMIT is still accepted (a worker may come back), the broker
// logs it and ferry_model_workers says 0, and after --orphan-timeout-s its queued jobs fail
// `unavailable`, saying why. A worker that comes back serves new jobs again.
TEST(Metrics, JobsOfAModelWithoutWorkersFailAfterTheOrphanTimeout) {
  const int broker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.broker_args = {"--metrics-port", std::to_string(broker_port), "--orphan-timeout-s", "1"};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  Scraper broker{Url(broker_port, "/metrics")};
  ASSERT_TRUE(broker.WaitFor(names::kModelWorkers, {{"model", "tiny"}}, 1)) << fleet.Logs();

  fleet.worker(0).Signal(SIGTERM);  // drains and says BYE
  ASSERT_EQ(fleet.worker(0).Wait(), 0) << fleet.Logs();
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  ASSERT_TRUE(broker.WaitFor(names::kModelWorkers, {{"model", "tiny"}}, 0)) << fleet.Logs();

  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());
  std::string id;
  ASSERT_TRUE(c->Submit(TinyJob(3), &id).ok()) << "accepted: a worker may come back";
  Result r;
  ASSERT_TRUE(c->Wait(id, 60000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kFailed);
  EXPECT_EQ(r.error.code(), codes::kUnavailable) << r.error.ToString();
  EXPECT_NE(r.error.message().find("no worker for model tiny since "), std::string::npos)
      << r.error.ToString();
  const std::string log = fleet.broker().Log();
  EXPECT_NE(log.find("model tiny has no worker"), std::string::npos) << log;
  EXPECT_NE(log.find("queued job(s) of model tiny failed unavailable"), std::string::npos) << log;

  fleet.StartWorker(0);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  ASSERT_TRUE(c->Submit(TinyJob(4), &id).ok());
  ASSERT_TRUE(c->Wait(id, 60000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
  EXPECT_TRUE(testutil::WaitFor([&] {
    return fleet.broker().Log().find("model tiny has a worker again") != std::string::npos;
  })) << fleet.broker().Log();
}

// A job restored from the journal is watched like any other, even when the set of model names
// has expired (or its model was retired) and no worker of it comes back: after
// --orphan-timeout-s it fails `unavailable`. (It used to stay pending for good, out of STATS
// and the metrics.)
TEST(Metrics, ARestoredJobOfAModelNobodyServesFailsAfterTheOrphanTimeout) {
  FleetOptions o;
  o.workers = 1;
  o.broker_args = {"--orphan-timeout-s", "1"};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  fleet.worker(0).Signal(SIGTERM);  // drains and says BYE
  ASSERT_EQ(fleet.worker(0).Wait(), 0) << fleet.Logs();
  ASSERT_TRUE(fleet.WaitForWorkers(0)) << fleet.Logs();
  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());
  std::string id;
  ASSERT_TRUE(c->Submit(TinyJob(5), &id).ok());  // journaled, queued
  fleet.broker().Signal(SIGKILL);                // before the orphan timeout fails it
  fleet.broker().Wait();
  protocol::RedisReply r;
  ASSERT_TRUE(fleet.redis().Connect()->Command({"DEL", "ferry:models"}, &r).ok());  // expired
  fleet.StartBroker();
  Result result;
  ASSERT_TRUE(c->Wait(id, 60000, &result).ok()) << fleet.Logs();
  EXPECT_EQ(result.state, JobState::kFailed);
  EXPECT_EQ(result.error.code(), codes::kUnavailable) << result.error.ToString();
}

// consume_results: every result a Wait or Run returned is gone from Redis once the client is
// done -- small ones too, which arrive inline in notices and are never read from Redis (a
// background thread deletes them in batches). Without it they stay until their TTL.
TEST(Metrics, ConsumeDeletesResultsThatCameInlineToo) {
  FleetOptions o;
  o.workers = 1;
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto results_in_redis = [&] {
    protocol::RedisReply keys;
    EXPECT_TRUE(fleet.redis().Connect()->Command({"KEYS", "ferry:result:*"}, &keys).ok());
    return keys.elements.size();
  };
  for (bool consume : {false, true}) {
    ClientOptions co;
    co.frontend = fleet.frontend();
    co.redis = fleet.redis().url();
    co.consume_results = consume;
    std::unique_ptr<Client> c;
    ASSERT_TRUE(Client::Create(co, &c).ok());
    std::vector<Job> jobs;
    for (uint32_t i = 0; i < 50; ++i) jobs.push_back(TinyJob(i));
    std::vector<SubmitOutcome> outcomes;
    ASSERT_TRUE(c->SubmitMany(jobs, &outcomes).ok());
    for (const auto& out : outcomes) {
      Result r;
      ASSERT_TRUE(c->Wait(out.id, 60000, &r).ok()) << fleet.Logs();
      ASSERT_EQ(r.state, JobState::kDone);
    }
    Result r;
    ASSERT_TRUE(c->Run(TinyJob(99), 60000, &r).ok()) << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone);
    c.reset();  // the deleter's last round trip
    EXPECT_EQ(results_in_redis(), consume ? 0u : 51u) << "consume_results=" << consume;
    protocol::RedisReply ignored;  // the next round starts empty
    ASSERT_TRUE(fleet.redis().Connect()->Command({"FLUSHDB"}, &ignored).ok());
  }
}

// Every non-empty line of a text-mode log is an event of its own: it starts with spdlog's
// timestamp, and `forged` (a text that looks like a log line) never starts one.
void ExpectOneLinePerEvent(const std::string& log, const std::string& forged) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    EXPECT_EQ(line.rfind("[20", 0), 0u) << "not a log line of its own: " << line;
    EXPECT_NE(line.rfind(forged, 0), 0u) << line;
  }
}

// A producer that stops reading while it sends SUBMITs whose ACCEPTED is big (10,000 rejected
// ids of 256 characters: ~2.8 MB each) pins at most --max-inline-backlog-bytes + 64 MiB of
// replies in the broker: the rest are dropped and counted. Before, only ZeroMQ's 10,000 messages
// a connection bounded them (28 GB here).
TEST(Metrics, RepliesToAProducerThatStopsReadingAreBoundedInBytes) {
  const int broker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 0;
  o.broker_args = {"--metrics-port", std::to_string(broker_port), "--max-inline-backlog-bytes",
                   "0"};
  Fleet fleet(o);
  Scraper broker{Url(broker_port, "/metrics")};
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvhwm, 1);  // hold as little as possible on this side
  s.set(zmq::sockopt::rcvbuf, 65536);
  s.connect(fleet.frontend());
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(10000);
  const std::string bad_id(256, '!');  // not a valid id: rejected, echoed back
  for (int i = 0; i < 10000; ++i)
    protocol::PackSubmitJob(pk, bad_id, "tiny", {testutil::RandomFloats({8}, 1)}, 0, 0, 0);
  constexpr int kSubmits = 60;
  const std::string body(buf.data(), buf.size());
  for (int i = 0; i < kSubmits; ++i) testutil::RawSend(s, {"FERRY1", "SUBMIT", body});
  // Each ACCEPTED is ~2.8 MB: 64 MiB holds ~23 of them, and the socket buffers a few more.
  ASSERT_TRUE(testutil::WaitFor([&] {
    return broker.Scrape() && broker.Sum(names::kRepliesDropped) >= kSubmits / 3;
  })) << broker.Sum(names::kRepliesDropped)
      << " dropped\n"
      << fleet.Logs();
  // The broker still answers others.
  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());
  std::string json;
  EXPECT_TRUE(c->Stats(&json).ok());
}

// Text-mode logs: one line per event, whatever the texts in it hold -- a worker name with a
// newline and a forged log line in it, which must not start a line of its own -- and the model
// error of a failed job on the one line that names the job.
TEST(Metrics, TextLogsAreOneLinePerEvent) {
  const std::string forged = "[2026-01-01 00:00:00.000] [info] forged";
  FleetOptions o;
  o.workers = 1;
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());
  std::string id;
  ASSERT_TRUE(c->Submit(TinyJob(7, {3}), &id).ok());  // wrong width: the model raises
  Result r;
  ASSERT_TRUE(c->Wait(id, 60000, &r).ok()) << fleet.Logs();
  ASSERT_EQ(r.state, JobState::kFailed);
  std::string log;
  ASSERT_TRUE(testutil::WaitFor([&] {
    log = fleet.worker(0).Log();
    return log.find("failed (first: job " + id) != std::string::npos;
  })) << log;
  ExpectOneLinePerEvent(log, forged);
  int failed_lines = 0;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("failed (first: job " + id) == std::string::npos) continue;
    ++failed_lines;
    EXPECT_NE(line.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << line;
  }
  EXPECT_EQ(failed_lines, 1) << log;

  // A second worker whose name holds a newline (the broker refuses such a name, so the worker
  // refuses to start, saying why): the name escaped, on the line of its event.
  testutil::TempDir dir;
  testutil::Process odd(
      {testutil::WorkerBin(), "--broker", fleet.backend(), "--redis", fleet.redis().url(),
       "--model", "tiny=" + testutil::ModelPath("tiny"), "--name", "w1\n" + forged},
      dir.path() + "/odd.log");
  EXPECT_EQ(odd.Wait(), 2) << odd.Log();  // the configuration's fault: not restarted
  ExpectOneLinePerEvent(odd.Log(), forged);
  EXPECT_NE(odd.Log().find("worker w1\\n" + forged), std::string::npos) << odd.Log();
}

}  // namespace
}  // namespace ferry
