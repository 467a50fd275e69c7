// Reliability on real processes (docs/reliability.md): whichever single process dies -- a worker,
// the broker, Redis with AOF -- every job the broker accepted ends with exactly one final result
// in Redis; poison jobs fail instead of killing the fleet; workers drain; queues are bounded;
// deadlines, cancellation and priorities hold. ctest runs them twice: as they are, and as
// curve.* with FERRY_TEST_CURVE=1 (CurveZMQ on both broker sockets; Fleet makes the keys).
//
// The `tiny` model's weights are fixed (ferry-make-models), so its expected outputs are computed
// here by hand: y[j] = sum_i x[i] * W[i][j] + b[j], W[i][j] = 0.01*(i*8+j) - 0.3, b[j] = 0.1*j.
// `slow` spins int(x) chained matmuls (about a millisecond each): a job that takes a while.
#include <gtest/gtest.h>
#include <signal.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/text_format.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"
#include "tiny_reference.h"

namespace ferry {
namespace {

using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::WaitFor;

using testutil::TinyExpected;
using testutil::TinyInput;

Job TinyJob(const std::string& id, uint32_t seed) {
  Job j;
  j.id = id;
  j.model = "tiny";
  j.inputs.push_back(Tensor::From<float>(TinyInput(seed), {8}, DType::kFloat32));
  return j;
}

Job SlowJob(const std::string& id, float spins, int64_t priority = 0) {
  Job j;
  j.id = id;
  j.model = "slow";
  j.priority = priority;
  j.inputs.push_back(Tensor::From<float>({spins}, {1}, DType::kFloat32));
  return j;
}

std::unique_ptr<Client> MakeClient(Fleet& fleet, int request_timeout_ms = 5000,
                                   int64_t stored_input_bytes = 64 * 1024) {
  ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.request_timeout_ms = request_timeout_ms;
  o.stored_input_bytes = stored_input_bytes;
  o.curve_server_public = fleet.curve_server_public();  // "" unless FERRY_TEST_CURVE=1
  o.curve_secret = fleet.curve_secret();
  std::unique_ptr<Client> c;
  EXPECT_TRUE(Client::Create(o, &c).ok());
  return c;
}

// Submits until every job is accepted: retryable rejections (queue_full, unavailable) are
// retried with the same ids, and a `duplicate` on a retry means an earlier try got in.
void SubmitUntilAccepted(Client& c, const std::vector<Job>& jobs,
                         const std::chrono::seconds limit = std::chrono::seconds(90)) {
  std::vector<Job> todo = jobs;
  std::set<std::string> tried;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!todo.empty()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << todo.size() << " never accepted";
    std::vector<SubmitOutcome> outcomes;
    c.SubmitMany(todo, &outcomes);
    std::vector<Job> again;
    for (size_t i = 0; i < todo.size(); ++i) {
      const Status& s = outcomes.at(i).status;
      const bool retried = tried.count(todo[i].id) != 0;
      if (s.ok() || (retried && s.code() == codes::kDuplicate)) continue;
      ASSERT_TRUE(s.retryable()) << todo[i].id << ": " << s.ToString();
      again.push_back(todo[i]);
      tried.insert(todo[i].id);
    }
    todo.swap(again);
    // Not synchronisation: a retry's back-off, as a producer's would be (the fleet may need a
    // while to take jobs again, e.g. until Redis or a broker is back).
    if (!todo.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Waits for every id's result; returns them by id.
std::map<std::string, Result> WaitAll(Client& c, const std::vector<std::string>& ids,
                                      int timeout_ms = 120000) {
  std::map<std::string, Result> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (const auto& id : ids) {
    Result r;
    while (true) {
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now())
                                            .count());
      Status s = c.Wait(id, std::max(left, 0), &r);
      if (s.ok() || s.code() != codes::kUnavailable || left <= 0) break;  // Redis restarting
    }
    out[id] = r;
  }
  return out;
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

// The sum of the samples of `name` matching `labels` on the /metrics endpoint at `port` (-1 when
// it cannot be scraped).
double ScrapeSum(int port, const std::string& name,
                 const std::map<std::string, std::string>& labels) {
  std::string body;
  metrics::ParsedText parsed;
  if (!metrics::HttpGet("http://127.0.0.1:" + std::to_string(port) + "/metrics", 2000, &body)
           .ok() ||
      !metrics::ParseText(body, &parsed).ok())
    return -1;
  return metrics::SumSamples(parsed, name, labels);
}

// Resident set size of a process, from /proc.
int64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

// The in_flight count the broker's STATS reports for the worker process `pid` (-1: not listed).
int64_t InFlightOf(Client& c, pid_t pid) {
  std::string json;
  if (!c.Stats(&json).ok()) return -1;
  size_t at = json.find("\"pid\":" + std::to_string(pid) + ",");
  if (at == std::string::npos) return -1;
  at = json.find("\"in_flight\":", at);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + 12, nullptr, 10);
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

// Fast failure detection for tests: a peer silent for 300 ms is presumed dead.
const std::vector<std::string> kFastHeartbeats = {"--heartbeat-ms", "100", "--liveness", "3"};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
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

TEST(Reliability, PoisonJobFailsAfterMaxAttemptsAndTheFleetKeepsServing) {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"slow"};
  fo.max_batch = 1;
  fo.broker_args = Concat(kFastHeartbeats, {"--max-attempts", "3"});
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet);
  std::string id;
  ASSERT_TRUE(c->Submit(SlowJob("poison", 1e6f), &id).ok());  // would run for many minutes
  // Each time the job runs, its worker dies (as a job that crashes the process would do).
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const pid_t pid = fleet.worker(0).pid();
    ASSERT_TRUE(WaitFor([&] { return InFlightOf(*c, pid) == 1; }, std::chrono::seconds(60)))
        << "attempt " << attempt << ": the job never reached worker " << pid << "\n"
        << fleet.Logs();
    fleet.worker(0).Signal(SIGKILL);
    fleet.worker(0).Wait();
    fleet.StartWorker(0);
  }
  Result r;
  ASSERT_TRUE(c->Wait("poison", 30000, &r).ok()) << fleet.Logs();
  EXPECT_EQ(r.state, JobState::kFailed);
  EXPECT_EQ(r.error.code(), codes::kPoisoned) << r.error.ToString();
  EXPECT_EQ(r.attempt, 3);
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
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"slow"};
  fo.max_batch = 1;
  fo.broker_args = kFastHeartbeats;
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  Fleet fleet(fo);
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
  EXPECT_GE(ScrapeSum(metrics_port, metrics::names::kJobsRejected,
                      {{metrics::names::kLabelCode, codes::kUnavailable}}),
            1)
      << fleet.broker().Log();
}

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
  auto c = MakeClient(fleet);
  const int64_t rss_before = RssBytes(fleet.broker().pid());
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
  const int64_t rss_after = RssBytes(fleet.broker().pid());
  ASSERT_GT(rss_before, 0);
  // What it keeps is 200 x 64 KiB (x2 with the journal's copy in flight); far below 128 MiB.
  EXPECT_LT(rss_after - rss_before, 48ll << 20) << rss_before << " -> " << rss_after;
  // Thaw the worker: it reconnects, and every accepted job completes.
  fleet.worker(0).Signal(SIGCONT);
  const auto results = WaitAll(*c, accepted_ids, 60000);
  for (const auto& [id, r] : results) EXPECT_EQ(r.state, JobState::kDone) << id;
}

// One slow executor and a worker holding at most two jobs (max batch 1 x (1 instance + 1)):
// the rest wait at the broker, where deadlines, cancellation and priorities act.
FleetOptions OneSlowLane() {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"slow"};
  fo.max_batch = 1;
  fo.worker_args = {"--instances", "1"};
  return fo;
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
  std::ifstream out(dir.path() + "/out.txt");
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "not_found running\n");
}

// Jobs whose big inputs the producer stored in Redis (a claim check: the broker journals only
// their dtype and shape): a broker killed while they wait in its queue is replaced, the new one
// restores them from the journal, and the worker reads their inputs from Redis -- every output
// is the job's own input (null model). A queued one that is cancelled has its input deleted by
// the broker with the `cancelled` result; no input key is left at the end.
TEST(Reliability, StoredInputsSurviveABrokerKillAndGoWithTheirJobs) {
  FleetOptions fo = OneSlowLane();
  fo.models = {"slow", "null"};
  fo.broker_args = kFastHeartbeats;
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000);
  std::vector<Job> jobs = {SlowJob("kill-blocker", 2000)};
  for (int i = 0; i < 5; ++i) {
    Job j;
    j.id = "kill-big-" + std::to_string(i);
    j.model = "null";
    j.inputs = {Tensor::From<float>(std::vector<float>(50000, 1.0f + i), {50000},
                                    DType::kFloat32)};  // 200 KB: stored in Redis
    jobs.push_back(std::move(j));
  }
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
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  fleet.StartBroker();
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id);
  const auto results = WaitAll(*c, ids, 60000);
  for (size_t i = 1; i < jobs.size(); ++i) {
    const Result& r = results.at(jobs[i].id);
    ASSERT_EQ(r.state, JobState::kDone) << jobs[i].id << " " << r.error.ToString() << fleet.Logs();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << jobs[i].id;
  }
  auto redis = fleet.redis().Connect();
  protocol::RedisReply keys;
  ASSERT_TRUE(redis->Command({"KEYS", "ferry:input:*"}, &keys).ok());
  EXPECT_TRUE(keys.elements.empty()) << keys.elements.size() << " input key(s) left";
}

// Big inputs sent through the broker in data frames of their own (attached: the client stores
// nothing in Redis). A worker killed while it holds one gets it requeued, and the broker sends
// its frames again; the broker journals them with their bytes, so one killed while they wait in
// its queue is replaced, the new one restores them from the journal and sends them to the
// worker in the ordinary form -- every output is the job's own input (null model).
TEST(Reliability, AttachedInputsSurviveAWorkerKillAndABrokerKill) {
  FleetOptions fo = OneSlowLane();
  fo.models = {"slow", "null"};
  fo.broker_args = kFastHeartbeats;
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  auto c = MakeClient(fleet, 1000, /*stored_input_bytes=*/0);
  std::vector<Job> jobs = {SlowJob("att-kill-blocker", 2000)};
  for (int i = 0; i < 5; ++i) {
    Job j;
    j.id = "att-kill-" + std::to_string(i);
    j.model = "null";
    j.inputs = {Tensor::From<float>(std::vector<float>(50000, 2.0f + i), {50000},
                                    DType::kFloat32)};  // 200 KB: attached
    jobs.push_back(std::move(j));
  }
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
    protocol::RedisReply keys;
    ASSERT_TRUE(redis->Command({"KEYS", "ferry:input:*"}, &keys).ok());
    EXPECT_TRUE(keys.elements.empty()) << "attached inputs were stored in Redis";
    protocol::RedisReply entry;
    ASSERT_TRUE(redis->Command({"HSTRLEN", "ferry:journal", "att-kill-4"}, &entry).ok());
    EXPECT_GT(entry.integer, 200000) << "the journal entry lacks the input's bytes";
  }
  fleet.broker().Signal(SIGKILL);
  fleet.broker().Wait();
  fleet.StartBroker();
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id);
  const auto results = WaitAll(*c, ids, 60000);
  for (size_t i = 1; i < jobs.size(); ++i) {
    const Result& r = results.at(jobs[i].id);
    ASSERT_EQ(r.state, JobState::kDone) << jobs[i].id << " " << r.error.ToString() << fleet.Logs();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << jobs[i].id;
  }
  EXPECT_GE(results.at("att-kill-0").attempt, 2) << "the killed worker's job was not requeued";
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

}  // namespace
}  // namespace ferry
