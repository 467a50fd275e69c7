// Big inputs end to end, on real redis-server, ferry-broker and ferry-worker processes with a
// worker that returns its input (null model): 602 KB jobs come back whole while the servers keep
// freed memory; inputs of 64 KiB and more go through Redis (the SDK's claim check) and leave no
// key behind; inputs in the body, attached in frames of their own and stored in one SubmitMany.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "end_to_end_fixture.h"
#include "ferry/client.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry::end_to_end_test {
namespace {

// Jobs of 602 KB (an RGB 224x224 image as float32) through a worker that returns its input:
// every byte comes back, round after round, and the broker and the worker report that they keep
// freed memory for reuse (protocol/malloc_policy.h), which is what spares them a page fault per
// 4 KiB of every such message (docs/performance.md, step 13).
TEST_F(EndToEnd, BigJobsComeBackWholeAndServersKeepFreedMemory) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  for (uint32_t round = 0; round < 3; ++round) {
    std::vector<Job> jobs;
    for (uint32_t i = 0; i < 6; ++i) {
      Job j;
      j.model = "null";
      j.inputs = {testutil::RandomFloats({3, 224, 224}, 100 * round + i)};
      jobs.push_back(std::move(j));
    }
    const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
      ASSERT_EQ(results[i].outputs.size(), 1u);
      EXPECT_EQ(results[i].outputs[0].shape, jobs[i].inputs[0].shape);
      EXPECT_TRUE(results[i].outputs[0].data == jobs[i].inputs[0].data)
          << "round " << round << ", job " << i;
    }
  }
  // The log line is the only place the servers say so: mallopt settings are invisible from
  // outside the process, and neither /metrics nor STATS reports them.
  for (const std::string& log : {fleet_->broker().Log(), fleet_->worker(0).Log()})
    EXPECT_NE(log.find("malloc keeps freed memory"), std::string::npos) << log;
}

// Inputs of at least the client's stored_input_bytes (64 KiB) go to Redis, not through the
// broker: the results are the same, and no input key is left once the jobs are done -- neither
// of the accepted jobs (the worker deletes them with the result) nor of a rejected one (the SDK
// deletes them). A client with stored_input_bytes 0 sends the same job through the broker.
TEST_F(EndToEnd, BigInputsGoThroughRedisAndLeaveNoKeyBehind) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  const int64_t dels_before = CommandCalls(*fleet_, {"del"});
  const int64_t sets_before = CommandCalls(*fleet_, {"set"});
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 8; ++i) {
    Job j;
    j.model = "null";
    j.inputs = {testutil::RandomFloats({100, 1000}, 500 + i)};  // 400 KB: stored
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(results[i].state, JobState::kDone) << results[i].error.ToString();
    EXPECT_TRUE(results[i].outputs.at(0).data == jobs[i].inputs[0].data) << i;
  }
  Result r;
  Job rejected = jobs[0];
  rejected.model = "no-such-model";
  std::string id;
  EXPECT_EQ(client_->Run(rejected, 10000, &r, &id).code(), codes::kUnknownModel);
  EXPECT_TRUE(NoInputKeysLeft(*fleet_)) << "input keys left in Redis";
  // They were there (stored, one SET each), and went by DEL: the worker's after the results
  // (several jobs' keys in one), the SDK's for the rejected job's input.
  EXPECT_GE(CommandCalls(*fleet_, {"set"}) - sets_before, 9);
  EXPECT_GE(CommandCalls(*fleet_, {"del"}) - dels_before, 2);

  ClientOptions through_broker;
  through_broker.frontend = fleet_->frontend();
  through_broker.redis = fleet_->redis().url();
  through_broker.stored_input_bytes = 0;
  std::unique_ptr<Client> direct;
  ASSERT_TRUE(Client::Create(through_broker, &direct).ok());
  Job again = jobs[1];
  ASSERT_TRUE(direct->Run(again, 60000, &r).ok());
  EXPECT_TRUE(r.outputs.at(0).data == jobs[1].inputs[0].data);
}

// The client's three forms of an input in one SubmitMany: in the body (< 16 KiB), attached in
// a data frame of its own (16 KiB to 64 KiB, through the broker uncopied) and stored in Redis
// (>= 64 KiB). Every output is its job's own input (null model); no input key is left.
TEST_F(EndToEnd, BodyAttachedAndStoredInputsInOneSubmit) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  StartFleet(o);
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 9; ++i) {
    const int64_t n = i % 3 == 0 ? 250 : i % 3 == 1 ? 10000 : 30000;  // 1 KB, 40 KB, 120 KB
    Job j;
    j.model = "null";
    j.inputs = {testutil::RandomFloats({n}, 900 + i)};
    jobs.push_back(std::move(j));
  }
  const std::vector<Result> results = RunAll(*client_, jobs, *fleet_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_EQ(results[i].state, JobState::kDone) << i << " " << results[i].error.ToString();
    EXPECT_TRUE(results[i].outputs.at(0).data == jobs[i].inputs[0].data) << i;
  }
  EXPECT_TRUE(NoInputKeysLeft(*fleet_)) << "input keys left in Redis";
  // attached_input_bytes 0: the 40 KB inputs go in the body again, with the same results.
  ClientOptions in_body;
  in_body.frontend = fleet_->frontend();
  in_body.redis = fleet_->redis().url();
  in_body.attached_input_bytes = 0;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(in_body, &c).ok());
  Result r;
  ASSERT_TRUE(c->Run(jobs[1], 60000, &r).ok());
  EXPECT_TRUE(r.outputs.at(0).data == jobs[1].inputs[0].data);
  in_body.attached_input_bytes = -1;
  EXPECT_EQ(Client::Create(in_body, &c).code(), codes::kInvalidArgument);
}
}  // namespace
}  // namespace ferry::end_to_end_test
