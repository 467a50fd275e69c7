#pragma once
// What the end-to-end tests share (end_to_end_test.cc, end_to_end_input_test.cc,
// end_to_end_model_test.cc): the EndToEnd fixture -- a fleet of real redis-server, ferry-broker
// and ferry-worker processes on free ports, and an SDK client for it -- plus `tiny` jobs, running
// a batch of jobs to their results, and what Redis says (command counts, keys).

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry::end_to_end_test {

using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;

inline std::unique_ptr<Client> Connect(Fleet& fleet, bool push_results = true) {
  ClientOptions o;
  o.frontend = fleet.frontend();
  o.redis = fleet.redis().url();
  o.push_results = push_results;
  std::unique_ptr<Client> c;
  Status s = Client::Create(o, &c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

inline Job TinyJob(uint32_t seed) {
  Job j;
  j.model = "tiny";
  j.inputs = {testutil::RandomFloats({8}, seed)};
  return j;
}

// Submits all jobs in one message and waits for every result.
inline std::vector<Result> RunAll(Client& c, const std::vector<Job>& jobs, Fleet& fleet) {
  std::vector<SubmitOutcome> outcomes;
  Status s = c.SubmitMany(jobs, &outcomes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<Result> results(jobs.size());
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    Status w = c.Wait(outcomes[i].id, 60000, &results[i]);
    EXPECT_TRUE(w.ok()) << w.ToString() << "\n" << fleet.Logs();
  }
  return results;
}

class EndToEnd : public ::testing::Test {
 protected:
  void StartFleet(FleetOptions o) {
    fleet_ = std::make_unique<Fleet>(std::move(o));
    ASSERT_TRUE(fleet_->WaitForWorkers(fleet_->worker_count())) << fleet_->Logs();
    client_ = Connect(*fleet_);
  }
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<Client> client_;
};

// Calls of these Redis commands served so far, from INFO commandstats.
inline int64_t CommandCalls(Fleet& fleet, std::initializer_list<const char*> commands) {
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::RedisEndpoint ep;
  ep.port = fleet.redis().port();
  if (!protocol::RedisClient::Connect(ep, 2000, &redis).ok()) return -1;
  protocol::RedisReply info;
  if (!redis->Command({"INFO", "commandstats"}, &info).ok()) return -1;
  int64_t calls = 0;
  for (const char* cmd : commands) {
    const std::string key = std::string("cmdstat_") + cmd + ":calls=";
    size_t at = info.str.find(key);
    if (at != std::string::npos) calls += std::stoll(info.str.substr(at + key.size()));
  }
  return calls;
}

// The keys in Redis matching `pattern`.
inline std::vector<std::string> KeysMatching(Fleet& fleet, const std::string& pattern) {
  std::vector<std::string> out;
  auto redis = fleet.redis().Connect();
  protocol::RedisReply r;
  if (redis && redis->Command({"KEYS", pattern}, &r).ok())
    for (const auto& e : r.elements) out.push_back(e.str);
  return out;
}

// Whether no stored input is left in Redis, waiting for it (up to WaitFor's 30 s): a worker
// deletes a job's stored inputs in the round after its result (never beside its SET), so a
// producer can read the result a moment before they go.
inline bool NoInputKeysLeft(Fleet& fleet) {
  return testutil::WaitFor([&] { return KeysMatching(fleet, "ferry:input:*").empty(); });
}

}  // namespace ferry::end_to_end_test
