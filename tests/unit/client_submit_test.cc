// Client::Submit/SubmitMany/Stats/Wait over real ZeroMQ sockets: against no broker at all, and
// against a scripted frontend peer (client_scripted_frontend.h) that accepts model "m", rejects
// other models, answers STATS and sends FINISHED. The SDK's FrontendConnection is tested on its
// own in client_frontend_connection_test.cc.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "client_redis_fixture.h"
#include "client_scripted_frontend.h"
#include "ferry/client.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using client_test::ScriptedFrontend;

Job MakeJob(std::string model, std::string id = "") {
  Job j;
  j.id = std::move(id);
  j.model = std::move(model);
  j.inputs.push_back(Tensor::From<float>({1.f, 2.f}, {2}, DType::kFloat32));
  return j;
}

class ClientSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = client_test::FreePort();
    options_.frontend = "tcp://127.0.0.1:" + std::to_string(port_);
    options_.redis = "redis://127.0.0.1:" + std::to_string(client_test::FreePort());
    options_.redis_prefix = "test:";
    options_.request_timeout_ms = 2000;
  }
  std::unique_ptr<Client> MakeClient() {
    std::unique_ptr<Client> c;
    Status s = Client::Create(options_, &c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return c;
  }
  int port_ = 0;
  ClientOptions options_;
};

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

TEST_F(ClientSubmitTest, BrokerStartedAfterClientStillAnswers) {
  auto client = MakeClient();
  std::this_thread::sleep_for(milliseconds(200));  // let the client try to connect first
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

// FINISHED wakes Wait at once, long before its backed-off re-check would have come.
TEST_F(ClientSubmitTest, FinishedNoticeWakesWait) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "f-1"), &id).ok());

  Clock::time_point written;
  std::thread worker([&] {
    // Re-checks happen at ~0, 50, 150, 350, 750, 1550, 2550 ms: write just after 1550.
    std::this_thread::sleep_for(milliseconds(1650));
    protocol::ResultRecord r;
    r.id = id;
    r.status = "done";
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    protocol::PackResult(pk, r);
    protocol::RedisReply reply;
    auto c = redis.Connect();
    ASSERT_TRUE(c->Command({"SET", protocol::Keys("test:").Result(id),
                            std::string_view(buf.data(), buf.size())}, &reply).ok());
    written = Clock::now();
    broker.Finish({"unrelated-id", id});
  });
  Result result;
  Status s = client->Wait(id, 10000, &result);
  Clock::time_point returned = Clock::now();
  worker.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_LT(returned - written, milliseconds(500)) << "woke by the re-check, not by FINISHED";
}

// How many times Redis has run `command` (INFO commandstats).
int64_t CommandCalls(client_test::RedisProcess& redis, const std::string& command) {
  protocol::RedisReply reply;
  auto c = redis.Connect();
  if (!c->Command({"INFO", "commandstats"}, &reply).ok()) return -1;
  const std::string key = "cmdstat_" + command + ":calls=";
  size_t at = reply.str.find(key);
  return at == std::string::npos ? 0 : std::stoll(reply.str.substr(at + key.size()));
}

void WriteDone(client_test::RedisProcess& redis, const std::string& id, int64_t batch_size) {
  protocol::ResultRecord r;
  r.id = id;
  r.status = "done";
  r.batch_size = batch_size;
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, r);
  protocol::RedisReply reply;
  auto c = redis.Connect();
  ASSERT_TRUE(c->Command({"SET", protocol::Keys("test:").Result(id),
                          std::string_view(buf.data(), buf.size())}, &reply).ok());
}

// One FINISHED naming many of this client's jobs: their results come back in one batched read
// (MGET) shared by all the Waits, not one GET per Wait -- each Wait still gets its own result.
TEST_F(ClientSubmitTest, OneFinishedNoticeIsReadInOneRoundTripForAllWaiters) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  constexpr int kJobs = 20;
  std::vector<Job> jobs;
  for (int i = 0; i < kJobs; ++i) jobs.push_back(MakeJob("m", "batch-" + std::to_string(i)));
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client->SubmitMany(jobs, &outcomes).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    ids.push_back(outcomes[i].id);
    WriteDone(redis, ids.back(), 100 + i);  // batch_size tells the results apart
  }
  const int64_t gets_before = CommandCalls(redis, "get");
  const int64_t mgets_before = CommandCalls(redis, "mget");
  broker.Finish(ids);

  // Half the jobs have a waiting thread each (two threads share job 0); the rest are waited
  // for afterwards, one after another.
  std::vector<Result> results(kJobs);
  std::vector<Status> statuses(kJobs);
  Result shared;
  Status shared_status;
  std::vector<std::thread> threads;
  for (int i = 0; i < kJobs / 2; ++i)
    threads.emplace_back([&, i] { statuses[i] = client->Wait(ids[i], 10000, &results[i]); });
  threads.emplace_back([&] { shared_status = client->Wait(ids[0], 10000, &shared); });
  for (auto& th : threads) th.join();
  for (int i = kJobs / 2; i < kJobs; ++i) statuses[i] = client->Wait(ids[i], 10000, &results[i]);

  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    EXPECT_EQ(results[i].state, JobState::kDone);
    EXPECT_EQ(results[i].id, ids[i]);
    EXPECT_EQ(results[i].batch_size, 100 + i);
  }
  ASSERT_TRUE(shared_status.ok()) << shared_status.ToString();
  EXPECT_EQ(shared.batch_size, 100);
  const int64_t reads = CommandCalls(redis, "get") - gets_before +
                        CommandCalls(redis, "mget") - mgets_before;
  EXPECT_GE(CommandCalls(redis, "mget") - mgets_before, 1);
  EXPECT_LT(reads, kJobs / 2) << "results were read one by one, not batched";
}

// Results that come inside FINISHED are returned by Wait without any Redis read; a FINISHED
// that names an id without its record still leads to a read of that one (from Redis).
TEST_F(ClientSubmitTest, InlineResultsInFinishedNeedNoRedisRead) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client->SubmitMany({MakeJob("m", "inl-1"), MakeJob("m", "inl-2"),
                                  MakeJob("m", "inl-3")}, &outcomes).ok());
  EXPECT_TRUE(broker.asked_inline()) << "the SDK asks for inline results";
  std::vector<std::string> ids;
  for (const auto& o : outcomes) {
    ASSERT_TRUE(o.status.ok()) << o.status.ToString();
    ids.push_back(o.id);
  }
  // Records for the first two are only inline (never written to Redis here: a read would find
  // nothing); the third is only in Redis.
  std::vector<std::pair<std::string, std::string>> records;
  for (int i = 0; i < 2; ++i) {
    Tensor out = Tensor::From<float>({1.5f * (i + 1)}, {1}, DType::kFloat32);
    protocol::ResultRecord r;
    r.id = ids[i];
    r.status = "done";
    r.model = "m";
    r.worker = "w";
    r.outputs.push_back(
        protocol::TensorRef{out.dtype, out.shape, out.data.data(), out.data.size()});
    r.batch_size = 40 + i;
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    protocol::PackResult(pk, r);
    records.emplace_back(ids[i], std::string(buf.data(), buf.size()));
  }
  WriteDone(redis, ids[2], 42);
  const int64_t reads_before = CommandCalls(redis, "get") + CommandCalls(redis, "mget");
  broker.Finish(ids, records);

  Result r0, r1;
  ASSERT_TRUE(client->Wait(ids[0], 10000, &r0).ok());
  ASSERT_TRUE(client->Wait(ids[1], 10000, &r1).ok());
  EXPECT_EQ(r0.state, JobState::kDone);
  EXPECT_EQ(r0.id, ids[0]);
  EXPECT_EQ(r0.batch_size, 40);
  ASSERT_EQ(r0.outputs.size(), 1u);
  EXPECT_EQ(r0.outputs[0].As<float>(), (std::vector<float>{1.5f}));
  EXPECT_EQ(r1.batch_size, 41);
  EXPECT_EQ(r1.outputs[0].As<float>(), (std::vector<float>{3.0f}));
  EXPECT_EQ(CommandCalls(redis, "get") + CommandCalls(redis, "mget"), reads_before)
      << "inline results were read from Redis";

  Result r2;
  ASSERT_TRUE(client->Wait(ids[2], 10000, &r2).ok());
  EXPECT_EQ(r2.batch_size, 42);
  EXPECT_GT(CommandCalls(redis, "get") + CommandCalls(redis, "mget"), reads_before);
}

// A garbled inline record is not trusted: Wait falls back to the record in Redis.
TEST_F(ClientSubmitTest, UndecodableInlineRecordFallsBackToRedis) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "garbled-1"), &id).ok());
  WriteDone(redis, id, 9);
  broker.Finish({id}, {{id, "not a msgpack result record"}});
  Result result;
  ASSERT_TRUE(client->Wait(id, 10000, &result).ok());
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_EQ(result.batch_size, 9);
}

// A job this client submitted whose FINISHED notice is lost (e.g. a broker restart) is still
// found by the slow re-check.
TEST_F(ClientSubmitTest, LostNoticeIsCoveredByTheRecheck) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "lost-1"), &id).ok());
  WriteDone(redis, id, 7);  // and no FINISHED
  Result result;
  Status s = client->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_EQ(result.batch_size, 7);
  // Wait(…, 0) still checks once, also for a job of ours with no notice.
  std::string id2;
  ASSERT_TRUE(client->Submit(MakeJob("m", "lost-2"), &id2).ok());
  WriteDone(redis, id2, 8);
  s = client->Wait(id2, 0, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 8);
}

// A FINISHED body for one job holding `record` inline, as a worker publishes it.
std::string Notice(const std::string& id, const std::string& record) {
  protocol::InlineResults records{{id, record}};
  zmq::message_t m = protocol::EncodeFinished({id}, records);
  return std::string(static_cast<const char*>(m.data()), m.size());
}

std::string DoneRecord(const std::string& id, int64_t batch_size) {
  protocol::ResultRecord r;
  r.id = id;
  r.status = "done";
  r.batch_size = batch_size;
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, r);
  return std::string(buf.data(), buf.size());
}

// Light load: the SUBMIT names this client's channel ("notify": <prefix>notify:<uuid>), the
// client is subscribed to it before the SUBMIT goes out, and a notice published there wakes
// Wait -- here it is the only source: no FINISHED, and nothing in Redis.
TEST_F(ClientSubmitTest, ResultNoticeOnTheNotifyChannelWakesWait) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "push-1"), &id).ok());
  const std::string channel = broker.notify();
  EXPECT_TRUE(protocol::Keys("test:").IsNotifyChannel(channel)) << channel;
  protocol::RedisReply receivers;
  auto c = redis.Connect();
  ASSERT_TRUE(c->Command({"PUBLISH", channel, Notice(id, DoneRecord(id, 31))}, &receivers).ok());
  EXPECT_EQ(receivers.integer, 1) << "the client was not subscribed when it submitted";
  Result result;
  Status s = client->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 31);
  EXPECT_EQ(CommandCalls(redis, "get") + CommandCalls(redis, "mget"), 0);

  // The same channel serves the client's later jobs.
  ASSERT_TRUE(client->Submit(MakeJob("m", "push-2"), &id).ok());
  EXPECT_EQ(broker.notify(), channel);
  ASSERT_TRUE(c->Command({"PUBLISH", channel, Notice(id, DoneRecord(id, 32))}, &receivers).ok());
  ASSERT_TRUE(client->Wait(id, 10000, &result).ok());
  EXPECT_EQ(result.batch_size, 32);
}

// push_results off, or no Redis to subscribe at: SUBMITs name no channel (FINISHED only), and
// submitting still works.
TEST_F(ClientSubmitTest, NoNotifyChannelWithoutPushOrWithoutRedis) {
  ScriptedFrontend broker(port_);
  {
    auto client = MakeClient();  // options_.redis: a free port, nothing listening
    std::string id;
    ASSERT_TRUE(client->Submit(MakeJob("m", "nopush-1"), &id).ok());
    EXPECT_EQ(broker.notify(), "");
  }
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  options_.push_results = false;
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "nopush-2"), &id).ok());
  EXPECT_EQ(broker.notify(), "");
}

// The subscription dies (Redis drops the connection): notices may be lost, so waiting jobs are
// read from Redis (the broker would send no FINISHED for notified jobs), and a later SUBMIT
// subscribes again, to a fresh channel.
TEST_F(ClientSubmitTest, LostSubscriptionFallsBackToRedisAndResubscribes) {
  client_test::RedisProcess redis;
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);
  auto client = MakeClient();
  std::string id;
  ASSERT_TRUE(client->Submit(MakeJob("m", "resub-1"), &id).ok());
  const std::string channel = broker.notify();
  ASSERT_FALSE(channel.empty());
  auto c = redis.Connect();
  protocol::RedisReply reply;
  ASSERT_TRUE(c->Command({"CLIENT", "KILL", "TYPE", "pubsub"}, &reply).ok());
  WriteDone(redis, id, 41);  // in Redis; its notice is never published
  Result result;
  Status s = client->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 41);
  // Subscribed again by a SUBMIT made after the client saw the connection close.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string id2;
  int64_t receivers = 0;
  while (receivers == 0 && Clock::now() < deadline) {
    ASSERT_TRUE(client->Submit(MakeJob("m"), &id2).ok());
    if (broker.notify().empty()) {
      std::this_thread::sleep_for(milliseconds(100));
      continue;
    }
    const std::string fresh = broker.notify();
    EXPECT_TRUE(protocol::Keys("test:").IsNotifyChannel(fresh)) << fresh;
    ASSERT_TRUE(c->Command({"PUBLISH", fresh, Notice(id2, DoneRecord(id2, 42))}, &reply).ok());
    receivers = reply.integer;
    if (receivers == 1) EXPECT_NE(fresh, channel);
  }
  ASSERT_EQ(receivers, 1) << "the client did not subscribe again";
  ASSERT_TRUE(client->Wait(id2, 10000, &result).ok());
  EXPECT_EQ(result.batch_size, 42);
}

// Leader/follower: many threads submit and wait at once through one client. Each reply and
// notice is dispatched by whichever thread drives the socket, and every thread gets its own
// results (the scripted broker echoes each job's input back as its output).
// kThreads threads each send kJobsEach echo jobs through `call` (Submit + Wait, or Run) and check
// that each got its own job's result back; returns how many did, and ADD_FAILUREs the first few
// that did not.
int EchoFromManyThreads(
    const std::function<Status(const Job& job, std::string* id, Result* r)>& call) {
  constexpr int kThreads = 8, kJobsEach = 40;
  std::atomic<int> good{0};
  std::vector<std::string> failures;
  std::mutex failures_mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kJobsEach; ++k) {
        const float tag = static_cast<float>(t * 1000 + k);
        Job job = MakeJob("m");
        job.inputs[0] = Tensor::From<float>({tag, -tag}, {2}, DType::kFloat32);
        std::string id;
        Result r;
        Status s = call(job, &id, &r);
        const bool echoed = s.ok() && r.state == JobState::kDone && r.id == id &&
                            r.outputs.size() == 1 &&
                            r.outputs[0].As<float>() == std::vector<float>{tag, -tag};
        if (echoed) {
          ++good;
        } else {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back("thread " + std::to_string(t) + " job " + std::to_string(k) +
                             ": " + s.ToString());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < failures.size() && i < 5; ++i) ADD_FAILURE() << failures[i];
  return good.load();
}
constexpr int kEchoJobs = 8 * 40;

TEST_F(ClientSubmitTest, ManyThreadsSubmitAndWaitThroughOneConnection) {
  ScriptedFrontend broker(port_);
  broker.set_echo(true);
  auto client = MakeClient();
  EXPECT_EQ(EchoFromManyThreads([&](const Job& job, std::string* id, Result* r) {
              Status s = client->Submit(job, id);
              return s.ok() ? client->Wait(*id, 10000, r) : s;
            }),
            kEchoJobs);
}

// Client::Run: each SUBMIT says "ack": false (so the broker sends no ACCEPTED), and each caller
// gets its own job's result, as Submit + Wait would give it.
TEST_F(ClientSubmitTest, RunAsksForNoAcceptedAndReturnsEachCallersResult) {
  ScriptedFrontend broker(port_);
  broker.set_echo(true);
  auto client = MakeClient();
  EXPECT_EQ(EchoFromManyThreads([&](const Job& job, std::string* id, Result* r) {
              return client->Run(job, 10000, r, id);
            }),
            kEchoJobs);
  EXPECT_EQ(broker.unacked_submits(), kEchoJobs);
  EXPECT_EQ(broker.submits(), kEchoJobs);
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
  EXPECT_EQ(client->Run(MakeJob("m", "bad id!"), 30000, &r, &id).code(),
            codes::kInvalidArgument);
  EXPECT_EQ(id, "bad id!");
  std::string json;
  ASSERT_TRUE(client->Stats(&json).ok());  // answered after anything sent before it
  EXPECT_EQ(broker.submits(), submits) << "the invalid job was sent";
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

// A Run that timed out, run again after its result came: returns the result and sends nothing.
TEST_F(ClientSubmitTest, RunAgainAfterATimeoutTakesTheResultThatCameWithoutResending) {
  client_test::RedisProcess redis;  // reachable, so the wait ends as a timeout
  ASSERT_TRUE(redis.ok());
  options_.redis = redis.url();
  ScriptedFrontend broker(port_);  // accepts silently, finishes nothing by itself
  auto client = MakeClient();
  Job job = MakeJob("m", "run-late");
  Result r;
  Status s = client->Run(job, 300, &r);
  ASSERT_EQ(s.code(), codes::kTimeout) << s.ToString();
  ASSERT_EQ(broker.submits(), 1);
  protocol::ResultRecord record;
  record.id = "run-late";
  record.status = "done";
  record.model = "m";
  const Tensor& x = job.inputs[0];
  record.outputs.push_back(protocol::TensorRef{x.dtype, x.shape, x.data.data(), x.data.size()});
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, record);
  broker.Finish({"run-late"}, {{"run-late", std::string(buf.data(), buf.size())}});
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
  protocol::ResultRecord record;
  record.id = "shared-id";
  record.status = "done";
  record.model = "m";
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, record);
  broker.Finish({"shared-id"}, {{"shared-id", std::string(buf.data(), buf.size())}});
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
