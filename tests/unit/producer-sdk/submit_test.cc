// Client::Submit/SubmitMany/Stats over real ZeroMQ sockets: against no broker at all, and
// against a scripted frontend peer (scripted_frontend.h) that accepts model "m", rejects other
// models and answers STATS. Results and their notices: notice_test.cc; Client::Run: run_test.cc.
// The SDK's I/O thread is tested on its own in io_thread_test.cc.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ferry/client.h"
#include "scripted_frontend.h"
#include "submit_fixture.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
using client_test::ClientSubmitTest;
using client_test::InputKeys;
using client_test::MakeJob;
using client_test::ScriptedFrontend;
using std::chrono::milliseconds;

TEST_F(ClientSubmitTest, CreateRejectsBadOptions) {
  std::unique_ptr<Client> c;
  ClientOptions bad = options_;
  bad.frontend = "not-an-endpoint";
  EXPECT_EQ(Client::Create(bad, &c).code(), codes::kInvalidArgument);
  bad = options_;
  bad.redis = "redis://127.0.0.1:notaport";
  EXPECT_EQ(Client::Create(bad, &c).code(), codes::kInvalidArgument);
  bad = options_;
  bad.request_timeout_ms = 0;
  EXPECT_EQ(Client::Create(bad, &c).code(), codes::kInvalidArgument);
  EXPECT_EQ(c, nullptr);
}

TEST_F(ClientSubmitTest, NoBrokerIsUnavailableAfterRequestTimeout) {
  options_.request_timeout_ms = 300;
  auto client = MakeClient();
  std::string id;
  auto start = Clock::now();
  Status s = client->Submit(MakeJob("m"), &id);
  auto elapsed = Clock::now() - start;
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_TRUE(s.retryable());
  EXPECT_NE(s.message().find("did not answer"), std::string::npos) << s.message();
  EXPECT_EQ(id.size(), 36u) << "a UUIDv4 is made for an empty id";
  EXPECT_GE(elapsed, milliseconds(300));
  EXPECT_LT(elapsed, milliseconds(1500));
  std::string json;
  EXPECT_EQ(client->Stats(&json).code(), codes::kUnavailable);
}

// No broker: the big input Submit stored in Redis before its SUBMIT is deleted again once the
// SUBMIT times out unsent (nobody will read it), rather than left for input_ttl_s -- when the SDK
// made the job's id. A caller's id may be a pending job's (this a retry of it): those keys are
// then that job's inputs, and are left to expire.
TEST_F(ClientSubmitTest, StoredInputsOfASubmitNeverSentAreDeleted) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  options_.request_timeout_ms = 300;
  auto client = MakeClient();  // options_.frontend: a free port, nothing listening
  Job job = MakeJob("m");      // the SDK makes its id
  job.inputs.push_back(
      Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32));  // 100 KB
  std::string id;
  Status s = client->Submit(job, &id);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("not sent"), std::string::npos) << s.message();
  EXPECT_EQ(client_test::CommandCalls(redis, "set"), 1) << "the big input was not stored";
  EXPECT_EQ(InputKeys(redis), std::vector<std::string>{}) << "the input of " << id << " was left";

  job.id = "unsent-1";  // the caller's id
  s = client->Submit(job, &id);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_EQ(InputKeys(redis), std::vector<std::string>{"test:input:unsent-1:1"});
}

// Redis refusing to store a big input fails the Submit before anything is sent: at maxmemory
// (OOM) as unavailable, a state that passes; and when it took the first of a job's inputs and
// refused the next (here: over its proto-max-bulk-len), the input it did store is deleted again
// (the SUBMIT is not sent: nobody would read it; the SDK made the id, as above).
TEST_F(ClientSubmitTest, InputsStoredBeforeRedisRefusedTheRestAreDeleted) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  auto client = MakeClient();
  auto c = redis.Connect();
  ASSERT_NE(c, nullptr);
  protocol::RedisReply reply;
  auto input = [](size_t floats) {
    return Tensor::From<float>(std::vector<float>(floats), {static_cast<int64_t>(floats)},
                               DType::kFloat32);
  };
  Job job = MakeJob("m");
  job.inputs.push_back(input(1 << 18));  // 1 MiB: stored
  job.inputs.push_back(input(1 << 20));  // 4 MiB: stored
  std::string id;
  ASSERT_TRUE(c->Command({"CONFIG", "SET", "maxmemory", "1"}, &reply).ok());
  Status s = client->Submit(job, &id);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("OOM"), std::string::npos) << s.message();
  ASSERT_TRUE(c->Command({"CONFIG", "SET", "maxmemory", "0"}, &reply).ok());

  ASSERT_TRUE(c->Command({"CONFIG", "SET", "proto-max-bulk-len", "2mb"}, &reply).ok());
  s = client->Submit(job, &id);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(client_test::CommandCalls(redis, "set"), 1) << "the first input was not stored";
  protocol::RedisReply keys;
  ASSERT_TRUE(c->Command({"KEYS", "test:input:*"}, &keys).ok());
  EXPECT_EQ(keys.elements.size(), 0u) << "an input stored before the refusal was left in Redis";
}

TEST_F(ClientSubmitTest, InvalidJobsFailLocallyWithoutTheNetwork) {
  auto client = MakeClient();
  std::string id;
  EXPECT_EQ(client->Submit(MakeJob("m", "bad id!"), &id).code(), codes::kInvalidArgument);
  EXPECT_EQ(id, "bad id!");
  EXPECT_EQ(client->Submit(MakeJob(""), &id).code(), codes::kInvalidArgument);
  Job wrong_size = MakeJob("m");
  wrong_size.inputs[0].shape = {3};  // 3 floats need 12 bytes, not 8
  auto start = Clock::now();
  Status s = client->Submit(wrong_size, &id);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("input 0"), std::string::npos) << s.message();
  EXPECT_LT(Clock::now() - start, milliseconds(200)) << "nothing should have been sent";
}

// A stored input is one Redis value, and Redis refuses one over 512 MiB by dropping the
// connection: such a job is too_large before anything is written or sent.
TEST_F(ClientSubmitTest, AnInputTooBigForOneRedisValueIsTooLargeWhenStored) {
  auto client = MakeClient();
  const size_t bytes = (size_t{512} << 20) - (size_t{1} << 20) + 1;
  Job big;
  big.model = "m";
  big.inputs.push_back(Tensor{DType::kUInt8, {static_cast<int64_t>(bytes)}, std::string(bytes, 0)});
  std::string id;
  Status s = client->Submit(big, &id);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("one Redis value"), std::string::npos) << s.message();
}

TEST_F(ClientSubmitTest, SubmitManyIsOneMessageWithPerJobOutcomes) {
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::vector<Job> jobs = {MakeJob("m", "a-1"), MakeJob("other", "a-2"), MakeJob("m"),
                           MakeJob("m", "a-1"), MakeJob("m", "bad id")};
  std::vector<SubmitOutcome> outcomes;
  Status s = client->SubmitMany(jobs, &outcomes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(outcomes.size(), 5u);
  EXPECT_EQ(outcomes[0].id, "a-1");
  EXPECT_TRUE(outcomes[0].status.ok()) << outcomes[0].status.ToString();
  EXPECT_EQ(outcomes[1].status.code(), codes::kUnknownModel);
  EXPECT_EQ(outcomes[1].id, "a-2");
  EXPECT_TRUE(outcomes[2].status.ok());
  EXPECT_EQ(outcomes[2].id.size(), 36u);
  EXPECT_EQ(outcomes[3].status.code(), codes::kDuplicate);
  EXPECT_EQ(outcomes[4].status.code(), codes::kInvalidArgument);
  EXPECT_EQ(broker.submits(), 1);
  EXPECT_EQ(broker.jobs_seen(), 3);

  std::string id;
  EXPECT_EQ(client->Submit(MakeJob("other", "b-1"), &id).code(), codes::kUnknownModel);
  EXPECT_EQ(id, "b-1");
  EXPECT_TRUE(client->Submit(MakeJob("m", "b-2"), &id).ok());
}

TEST_F(ClientSubmitTest, LargeBatchesAreSplitIntoSeveralMessages) {
  ScriptedFrontend broker(port_);
  options_.stored_input_bytes = 0;  // every input inside the SUBMIT
  auto client = MakeClient();
  std::vector<Job> jobs(3, MakeJob("m"));
  for (Job& j : jobs)
    j.inputs[0] =
        Tensor::From<float>(std::vector<float>(3 << 20), {3 << 20}, DType::kFloat32);  // 12 MiB
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client->SubmitMany(jobs, &outcomes).ok());
  for (const auto& o : outcomes) EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(broker.submits(), 2) << "24 MiB fit one 32 MiB message; the third job goes alone";
  EXPECT_EQ(broker.jobs_seen(), 3);
}

// A SubmitMany split before the broker's LIMITS answer (no broker yet) and refused whole for
// more jobs than its --max-jobs-per-message is split again under the limits it learned meanwhile
// and sent: no job is refused for the SDK's guess.
TEST_F(ClientSubmitTest, ASubmitSplitBeforeTheLimitsAreKnownIsSplitAgainUnderThem) {
  auto client = MakeClient();
  std::unique_ptr<ScriptedFrontend> broker;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(200));  // part of the scenario: no broker yet
    broker = std::make_unique<ScriptedFrontend>(port_, /*max_jobs_per_message=*/5);
  });
  std::vector<Job> jobs(12, MakeJob("m"));
  std::vector<SubmitOutcome> outcomes;
  Status s = client->SubmitMany(jobs, &outcomes);  // split while no limits are known: one part
  late.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(outcomes.size(), 12u);
  for (const auto& o : outcomes) EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(broker->submits(), 4) << "12 refused whole, then 5 + 5 + 2";
  EXPECT_EQ(broker->jobs_seen(), 12);
}

// A job over the broker's --max-message-bytes by itself is refused (too_large, never sent), and
// the jobs after it in the same call still go.
TEST_F(ClientSubmitTest, AJobAloneOverTheBrokersMessageLimitIsRefusedAndTheRestGo) {
  ScriptedFrontend broker(port_);
  broker.set_max_message_bytes(64 << 10);
  broker.set_max_job_bytes(1 << 20);  // a job of 100 KB is within it: its inputs could be stored
  options_.stored_input_bytes = 0;    // every input inside the SUBMIT
  auto client = MakeClient();
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // answered after LIMITS: the limits are known
  std::vector<Job> jobs = {MakeJob("m", "small-1"), MakeJob("m", "big"), MakeJob("m", "small-2")};
  jobs[1].inputs[0] = Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32);
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client->SubmitMany(jobs, &outcomes).ok());
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_TRUE(outcomes[0].status.ok()) << outcomes[0].status.ToString();
  EXPECT_EQ(outcomes[1].status.code(), codes::kTooLarge) << outcomes[1].status.ToString();
  EXPECT_TRUE(outcomes[2].status.ok()) << outcomes[2].status.ToString();
  EXPECT_EQ(broker.submits(), 2);
  EXPECT_EQ(broker.jobs_seen(), 2);
}

// Inputs of at least stored_input_bytes go to Redis before the SUBMIT, which carries only their
// dtype and shape ("stored": true); small ones travel inside it. The inputs of a job the broker
// rejects are deleted again.
TEST_F(ClientSubmitTest, BigInputsAreStoredInRedisAndOnlyNamedInTheSubmit) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.stored_input_bytes = 1000;
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::vector<float> big(1000);  // 4,000 bytes: stored
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  Job job = MakeJob("m", "stored-1");
  job.inputs.push_back(Tensor::From<float>(big, {1000}, DType::kFloat32));
  Job rejected = job;
  rejected.id = "stored-2";
  rejected.model = "unknown";  // the scripted broker rejects it
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client->SubmitMany({job, rejected}, &outcomes).ok());
  ASSERT_TRUE(outcomes[0].status.ok()) << outcomes[0].status.ToString();
  EXPECT_EQ(outcomes[1].status.code(), codes::kUnknownModel);
  EXPECT_EQ(broker.stored_inputs(), 2) << "the SUBMIT named the two big inputs as stored";
  auto c = redis.Connect();
  std::string value;
  bool found = false;
  ASSERT_TRUE(c->Get(protocol::Keys("test:").Input("stored-1", 1), &value, &found).ok());
  ASSERT_TRUE(found) << "the accepted job's big input is in Redis";
  EXPECT_EQ(value, job.inputs[1].data);
  ASSERT_TRUE(c->Get(protocol::Keys("test:").Input("stored-1", 0), &value, &found).ok());
  EXPECT_FALSE(found) << "the small input travelled in the SUBMIT";
  ASSERT_TRUE(c->Get(protocol::Keys("test:").Input("stored-2", 1), &value, &found).ok());
  EXPECT_FALSE(found) << "the rejected job's input was left in Redis";
  protocol::RedisReply ttl;
  ASSERT_TRUE(c->Command({"TTL", protocol::Keys("test:").Input("stored-1", 1)}, &ttl).ok());
  EXPECT_GT(ttl.integer, 3500) << "stored inputs expire (input_ttl_s, 3600 by default)";
}

TEST_F(ClientSubmitTest, BrokerStartedAfterClientStillAnswers) {
  auto client = MakeClient();
  // Part of the scenario, not synchronisation: the broker comes up late, after the client's
  // first connection attempt was refused (the attempt is made inside the SDK, where a test
  // cannot see it).
  std::this_thread::sleep_for(milliseconds(200));
  ScriptedFrontend broker(port_);  // binds after the client connected
  std::string id;
  Status s = client->Submit(MakeJob("m"), &id);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(ClientSubmitTest, ErrorReplyBecomesTheStatus) {
  ScriptedFrontend broker(port_);
  broker.set_error_reply(true);
  auto client = MakeClient();
  std::vector<SubmitOutcome> outcomes;
  Status s = client->SubmitMany({MakeJob("m", "e-1"), MakeJob("m", "e-2")}, &outcomes);
  EXPECT_EQ(s.code(), codes::kMalformed);
  EXPECT_EQ(s.message(), "scripted error");
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[1].status.code(), codes::kMalformed);
}

TEST_F(ClientSubmitTest, StatsIsJsonWithoutTheRid) {
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string json;
  Status s = client->Stats(&json);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(json.find("\"queues\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"m\":3"), std::string::npos) << json;
  EXPECT_EQ(json.find("rid"), std::string::npos) << json;
}

TEST_F(ClientSubmitTest, ConcurrentSubmitsMatchTheirReplies) {
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        std::string id;
        std::string want = "c-" + std::to_string(t) + "-" + std::to_string(i);
        if (client->Submit(MakeJob(i % 5 ? "m" : "x", want), &id).ok() == (i % 5 != 0) &&
            id == want)
          ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 200);
}

// Leader/follower: many threads submit and wait at once through one client. Each reply and
// notice is dispatched by whichever thread drives the socket, and every thread gets its own
// results (the scripted broker echoes each job's input back as its output).
TEST_F(ClientSubmitTest, ManyThreadsSubmitAndWaitThroughOneConnection) {
  ScriptedFrontend broker(port_);
  broker.set_echo(true);
  auto client = MakeClient();
  EXPECT_EQ(client_test::EchoFromManyThreads([&](const Job& job, std::string* id, Result* r) {
              Status s = client->Submit(job, id);
              return s.ok() ? client->Wait(*id, 10000, r) : s;
            }),
            client_test::kEchoJobs);
}

}  // namespace
}  // namespace ferry::client
