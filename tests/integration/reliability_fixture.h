#pragma once
// What the reliability tests share (reliability_kill_test.cc, reliability_input_test.cc,
// reliability_queue_test.cc): jobs for the `slow` model and 200 KB `null` jobs, a client for
// the fleet (with its CURVE keys when FERRY_TEST_CURVE=1), submitting until every job is
// accepted, waiting through a Redis restart, a worker's in-flight count from STATS, the input
// keys left in Redis, fast heartbeats and the one slow lane (with `null` behind it).
//
// `slow` spins int(x) chained matmuls (about a millisecond each): a job that takes a while.

#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"

namespace ferry::reliability_test {

using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::WaitFor;

inline Job SlowJob(const std::string& id, float spins, int64_t priority = 0) {
  Job j;
  j.id = id;
  j.model = "slow";
  j.priority = priority;
  j.inputs.push_back(Tensor::From<float>({spins}, {1}, DType::kFloat32));
  return j;
}

// A `null` job with one 200 KB float32 input (stored in Redis by a client with the default
// stored_input_bytes, attached by one with 0) whose values are all `value`.
inline Job BigNullJob(const std::string& id, float value) {
  Job j;
  j.id = id;
  j.model = "null";
  j.inputs = {Tensor::From<float>(std::vector<float>(50000, value), {50000}, DType::kFloat32)};
  return j;
}

// The input keys (ferry:input:*) in the fleet's Redis; -1 when Redis cannot be asked.
inline int64_t InputKeys(Fleet& fleet) {
  auto redis = fleet.redis().Connect();
  protocol::RedisReply keys;
  if (!redis || !redis->Command({"KEYS", "ferry:input:*"}, &keys).ok()) return -1;
  return static_cast<int64_t>(keys.elements.size());
}

inline std::unique_ptr<Client> MakeClient(Fleet& fleet, int request_timeout_ms = 5000,
                                          int64_t stored_input_bytes = 64 * 1024,
                                          int64_t input_ttl_s = 3600) {
  ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.request_timeout_ms = request_timeout_ms;
  o.stored_input_bytes = stored_input_bytes;
  o.input_ttl_s = input_ttl_s;
  o.curve_server_public = fleet.curve_server_public();  // "" unless FERRY_TEST_CURVE=1
  o.curve_secret = fleet.curve_secret();
  std::unique_ptr<Client> c;
  EXPECT_TRUE(Client::Create(o, &c).ok());
  return c;
}

// Submits until every job is accepted: retryable rejections (queue_full, unavailable) are
// retried with the same ids, and a `duplicate` on a retry means an earlier try got in.
inline void SubmitUntilAccepted(Client& c, const std::vector<Job>& jobs,
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
inline std::map<std::string, Result> WaitAll(Client& c, const std::vector<std::string>& ids,
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

// The in_flight count the broker's STATS reports for the worker process `pid` (-1: not listed).
inline int64_t InFlightOf(Client& c, pid_t pid) {
  std::string json;
  if (!c.Stats(&json).ok()) return -1;
  size_t at = json.find("\"pid\":" + std::to_string(pid) + ",");
  if (at == std::string::npos) return -1;
  at = json.find("\"in_flight\":", at);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + 12, nullptr, 10);
}

// Fast failure detection for tests: a peer silent for 300 ms is presumed dead.
inline const std::vector<std::string> kFastHeartbeats = {"--heartbeat-ms", "100", "--liveness",
                                                         "3"};

inline std::vector<std::string> Concat(std::vector<std::string> a,
                                       const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One slow executor and a worker holding at most two jobs (max batch 1 x (1 instance + 1)):
// the rest wait at the broker, where deadlines, cancellation and priorities act.
inline FleetOptions OneSlowLane() {
  FleetOptions fo;
  fo.workers = 1;
  fo.models = {"slow"};
  fo.max_batch = 1;
  fo.worker_args = {"--instances", "1"};
  return fo;
}

// OneSlowLane with fast heartbeats: a killed member is noticed within ~300 ms.
inline FleetOptions OneFastSlowLane() {
  FleetOptions fo = OneSlowLane();
  fo.broker_args = kFastHeartbeats;
  fo.worker_args = Concat(kFastHeartbeats, {"--instances", "1"});
  return fo;
}

// OneFastSlowLane serving `null` too: big `null` jobs (BigNullJob) wait behind a slow one.
inline FleetOptions BigJobsBehindASlowLane() {
  FleetOptions fo = OneFastSlowLane();
  fo.models = {"slow", "null"};
  return fo;
}

}  // namespace ferry::reliability_test
