// Client::Run (submit and wait in one call, SUBMIT "ack": false) against a scripted broker
// (client_scripted_frontend.h) that, like the real one, sends no ACCEPTED for such a SUBMIT when
// it accepted the job -- and against no broker at all.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "scripted_frontend.h"
#include "submit_fixture.h"

namespace ferry::client {
namespace {

using client_test::ClientSubmitTest;
using client_test::DoneRecord;
using client_test::InputKeys;
using client_test::MakeJob;
using client_test::ScriptedFrontend;

// Client::Run: each SUBMIT says "ack": false (so the broker sends no ACCEPTED), and each caller
// gets its own job's result, as Submit + Wait would give it.
TEST_F(ClientSubmitTest, RunAsksForNoAcceptedAndReturnsEachCallersResult) {
  ScriptedFrontend broker(port_);
  broker.set_echo(true);
  auto client = MakeClient();
  EXPECT_EQ(client_test::EchoFromManyThreads([&](const Job& job, std::string* id, Result* r) {
              return client->Run(job, 10000, r, id);
            }),
            client_test::kEchoJobs);
  EXPECT_EQ(broker.unacked_submits(), client_test::kEchoJobs);
  EXPECT_EQ(broker.submits(), client_test::kEchoJobs);
}

// A rejection comes back as Run's status (the reply to a request nobody Calls for reaches Run
// through the tracker) -- not as a timeout; so does an ERROR; invalid jobs fail locally.
TEST_F(ClientSubmitTest, RunReturnsRejectionsAndErrors) {
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  Result r;
  std::string id;
  Status s = client->Run(MakeJob("other", "run-rejected"), 30000, &r, &id);
  EXPECT_EQ(s.code(), codes::kUnknownModel) << s.ToString();
  EXPECT_EQ(id, "run-rejected");
  EXPECT_EQ(r.id, "run-rejected");
  EXPECT_EQ(r.state, JobState::kPending);
  broker.set_error_reply(true);
  s = client->Run(MakeJob("m"), 30000, &r);
  EXPECT_EQ(s.code(), codes::kMalformed) << s.ToString();
  EXPECT_NE(s.message().find("scripted error"), std::string::npos) << s.message();
  broker.set_error_reply(false);
  EXPECT_EQ(client->Run(MakeJob("m"), 0, &r).code(), codes::kInvalidArgument) << "timeout 0";
  const int submits = broker.submits();
  EXPECT_EQ(client->Run(MakeJob("m", "bad id!"), 30000, &r, &id).code(), codes::kInvalidArgument);
  EXPECT_EQ(id, "bad id!");
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // answered after anything sent before it
  EXPECT_EQ(broker.submits(), submits) << "the invalid job was sent";
}

// A Run or Submit whose SUBMIT the broker refuses as a whole (ERROR) leaves the stored inputs of
// a caller's id: the broker read none of the message's jobs, and that id may be a pending job's
// (a retry), whose inputs those keys are (protocol.md, "Stored inputs"). Those of an id the SDK
// made go. Before, Run deleted both, and Submit kept both unless the ERROR said too_large.
TEST_F(ClientSubmitTest, ARefusedSubmitDeletesOnlyTheStoredInputsOfAnIdTheSdkMade) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // connected, LIMITS answered
  broker.set_error_reply(true);
  Job job = MakeJob("m", "run-callers-id");
  job.inputs.push_back(
      Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32));  // 100 KB
  Result r;
  EXPECT_EQ(client->Run(job, 30000, &r).code(), codes::kMalformed);
  EXPECT_EQ(InputKeys(redis), std::vector<std::string>{"test:input:run-callers-id:1"});
  job.id.clear();  // the SDK makes it
  std::string id;
  EXPECT_EQ(client->Run(job, 30000, &r, &id).code(), codes::kMalformed);
  EXPECT_EQ(InputKeys(redis), std::vector<std::string>{"test:input:run-callers-id:1"}) << id;
  EXPECT_EQ(client->Submit(job, &id).code(), codes::kMalformed);
  EXPECT_EQ(InputKeys(redis), std::vector<std::string>{"test:input:run-callers-id:1"}) << id;
  job.id = "submit-callers-id";
  EXPECT_EQ(client->Submit(job, &id).code(), codes::kMalformed);
  EXPECT_EQ(InputKeys(redis), (std::vector<std::string>{"test:input:run-callers-id:1",
                                                        "test:input:submit-callers-id:1"}));
}

// A broker from before "ack" answers every SUBMIT with ACCEPTED: Run ignores it and still
// returns the result.
TEST_F(ClientSubmitTest, RunWorksWithABrokerThatAlwaysAnswersAccepted) {
  ScriptedFrontend broker(port_);
  broker.set_echo(true);
  broker.set_ignore_ack(true);
  auto client = MakeClient();
  for (int i = 0; i < 20; ++i) {
    Result r;
    std::string id;
    Status s = client->Run(MakeJob("m"), 10000, &r, &id);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(r.state, JobState::kDone);
    EXPECT_EQ(r.id, id);
  }
  EXPECT_EQ(broker.unacked_submits(), 20);
}

// A Run's timeout bounds the whole call: a stalled Redis (stopped: it accepts connections and
// never answers) holds the storing of the Run's big input no longer than that, not for the
// client's request_timeout_ms (here a minute). Before, the Run took that minute.
TEST_F(ClientSubmitTest, ARunsTimeoutBoundsStoringItsInputsInAStalledRedis) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  options_.request_timeout_ms = 60000;
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // connected, LIMITS answered
  Job job = MakeJob("m");
  job.inputs.push_back(
      Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32));  // 100 KB
  // A caller's id, and one the SDK makes (whose inputs the Run deletes again after the failed
  // write: within the same bound).
  for (const std::string id : {"run-stalled", ""}) {
    job.id = id;
    redis.Signal(SIGSTOP);
    const auto start = std::chrono::steady_clock::now();
    Result r;
    Status s = client->Run(job, 500, &r);
    const int64_t took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
    redis.Signal(SIGCONT);
    EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
    EXPECT_LT(took_ms, 30000) << "the Run waited for request_timeout_ms; id \"" << id << "\"";
  }
  EXPECT_EQ(broker.submits(), 0) << "sent before its inputs were stored";
}

// A Run that no broker took deletes its stored input (its id the SDK's): the keys are gone when
// it returns, though its job was known unsent only at its deadline.
TEST_F(ClientSubmitTest, ARunNoBrokerTookDeletesItsStoredInput) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  auto client = MakeClient();  // no broker
  Job job = MakeJob("m");
  job.inputs.push_back(
      Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32));  // 100 KB
  Result r;
  std::string id;
  const Status s = client->Run(job, 300, &r, &id);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  auto conn = redis.Connect();
  ASSERT_NE(conn, nullptr);
  protocol::RedisReply keys;
  ASSERT_TRUE(conn->Command({"KEYS", "test:input:*"}, &keys).ok());
  EXPECT_TRUE(keys.elements.empty()) << keys.elements.size() << " stored input(s) left";
}

// The same DEL with a Redis that stalled after the input was stored: it holds the Run at most
// kCleanupMs past its timeout. Before, that DEL waited for request_timeout_ms (here a minute),
// twice.
TEST_F(ClientSubmitTest, ARunsCleanupAfterItWasNotSentIsBoundedByItsTimeout) {
  testutil::RedisServer redis;
  options_.redis = redis.url();
  options_.push_results = false;
  options_.request_timeout_ms = 60000;
  auto client = MakeClient();  // no broker
  auto watcher = redis.Connect();
  ASSERT_NE(watcher, nullptr);
  Job job = MakeJob("m");
  job.inputs.push_back(
      Tensor::From<float>(std::vector<float>(25000), {25000}, DType::kFloat32));  // 100 KB
  Status s;
  std::atomic<bool> done{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread run([&] {
    Result r;
    s = client->Run(job, 1500, &r);
    done = true;
  });
  ASSERT_TRUE(testutil::WaitFor([&] {
    protocol::RedisReply keys;
    return watcher->Command({"KEYS", "test:input:*"}, &keys).ok() && !keys.elements.empty();
  }));
  redis.Signal(SIGSTOP);  // stored; now Redis stalls
  const bool ended = testutil::WaitFor([&] { return done.load(); }, std::chrono::seconds(30));
  redis.Signal(SIGCONT);
  run.join();
  const int64_t took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  EXPECT_TRUE(ended) << "the Run's cleanup waited for request_timeout_ms";
  EXPECT_LT(took_ms, 30000);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("it was not sent"), std::string::npos) << s.ToString();
}

// A Run that timed out, run again after its result came: returns the result and sends nothing.
TEST_F(ClientSubmitTest, RunAgainAfterATimeoutTakesTheResultThatCameWithoutResending) {
  testutil::RedisServer redis;  // reachable, so the wait ends as a timeout
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);  // accepts silently, finishes nothing by itself
  auto client = MakeClient();
  Job job = MakeJob("m", "run-late");
  Result r;
  Status s = client->Run(job, 300, &r);
  ASSERT_EQ(s.code(), codes::kTimeout) << s.ToString();
  ASSERT_EQ(broker.submits(), 1);
  broker.Finish({"run-late"}, {{"run-late", DoneRecord("run-late", 1, &job.inputs[0])}});
  // Make sure the FINISHED has reached the client first: the scripted broker sends queued
  // FINISHEDs at the top of each turn, so the one queued before the first STATS went out
  // precedes the second STATS's reply, and the STATS caller dispatches it on the way.
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());
  ASSERT_TRUE(client->Stats(&json).ok());
  s = client->Run(job, 30000, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_EQ(r.outputs.at(0).As<float>(), (std::vector<float>{1.f, 2.f}));
  ASSERT_TRUE(client->Stats(&json).ok());  // answered after anything sent before it
  EXPECT_EQ(broker.submits(), 1) << "the job was sent again";
}

// A rejection belongs to the Run that got it: another caller waiting on the same id (whose own
// submission was accepted) keeps waiting and gets the result.
TEST_F(ClientSubmitTest, ARejectedRunDoesNotEndAnotherWaitOnTheSameId) {
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  ASSERT_TRUE(client->Submit(MakeJob("m", "shared-id"), nullptr).ok());
  Result waited;
  Status waited_status;
  std::thread waiter([&] { waited_status = client->Wait("shared-id", 30000, &waited); });
  Result r;
  EXPECT_EQ(client->Run(MakeJob("other", "shared-id"), 30000, &r).code(), codes::kUnknownModel);
  broker.Finish({"shared-id"}, {{"shared-id", DoneRecord("shared-id", 1)}});
  waiter.join();
  ASSERT_TRUE(waited_status.ok()) << waited_status.ToString();
  EXPECT_EQ(waited.state, JobState::kDone);
}

// No broker: Run gives up at its timeout with unavailable, and the job it could not send is
// dropped -- a broker that comes up later never gets it.
TEST_F(ClientSubmitTest, RunWithoutBrokerIsUnavailableAndTheJobIsNeverSent) {
  auto client = MakeClient();
  Result r;
  Status s = client->Run(MakeJob("m", "run-unsent"), 300, &r);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("not sent"), std::string::npos) << s.message();
  ScriptedFrontend broker(port_);
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // connected: an unsent SUBMIT would precede STATS
  EXPECT_EQ(broker.jobs_seen(), 0);
}

}  // namespace
}  // namespace ferry::client
