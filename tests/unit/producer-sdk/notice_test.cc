// Client::Wait on results of jobs this client submitted: woken by the broker's FINISHED notices
// (ids, inline records) or by the worker's notices on the client's Redis channel, and found by
// the slow re-check when a notice is lost. Against a scripted broker (scripted_frontend.h) and a
// real redis-server.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/keys.h"
#include "scripted_frontend.h"
#include "submit_fixture.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
using client_test::ClientSubmitTest;
using client_test::CommandCalls;
using client_test::DoneRecord;
using client_test::MakeJob;
using client_test::Notice;
using client_test::ScriptedFrontend;
using client_test::WriteDone;
using std::chrono::milliseconds;

// A real redis-server, a scripted broker and a client of both, for the tests below.
class ClientNoticeTest : public ClientSubmitTest {
 protected:
  void SetUp() override {
    ClientSubmitTest::SetUp();
    options_.redis = redis_.url();
    broker_ = std::make_unique<ScriptedFrontend>(port_);
    client_ = MakeClient();
  }
  testutil::RedisServer redis_;
  std::unique_ptr<ScriptedFrontend> broker_;
  std::unique_ptr<Client> client_;
};

// FINISHED wakes Wait at once, long before its backed-off re-check would have come.
TEST_F(ClientNoticeTest, FinishedNoticeWakesWait) {
  std::string id;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "f-1"), &id).ok());

  Clock::time_point written;
  std::thread worker([&] {
    // Part of the scenario, not synchronisation: re-checks happen at ~0, 50, 150, 350, 750,
    // 1550, 2550 ms; write just after 1550, so that only FINISHED can wake Wait soon.
    std::this_thread::sleep_for(milliseconds(1650));
    WriteDone(redis_, id, 0);
    written = Clock::now();
    broker_->Finish({"unrelated-id", id});
  });
  Result result;
  Status s = client_->Wait(id, 10000, &result);
  Clock::time_point returned = Clock::now();
  worker.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_LT(returned - written, milliseconds(500)) << "woke by the re-check, not by FINISHED";
}

// One FINISHED naming many of this client's jobs, without their records: every Wait gets its
// own job's result with one Redis read (no polling), also two Waits on the same id.
TEST_F(ClientNoticeTest, OneFinishedNoticeWakesEveryWaiterWithItsOwnResult) {
  constexpr int kJobs = 20;
  std::vector<Job> jobs;
  for (int i = 0; i < kJobs; ++i) jobs.push_back(MakeJob("m", "batch-" + std::to_string(i)));
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(client_->SubmitMany(jobs, &outcomes).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    ids.push_back(outcomes[i].id);
    WriteDone(redis_, ids.back(), 100 + i);  // batch_size tells the results apart
  }
  const int64_t gets_before = CommandCalls(redis_, "get");

  // Half the jobs have a waiting thread each (two threads share job 0), started before the
  // notice; the rest are waited for afterwards, one after another.
  std::vector<Result> results(kJobs);
  std::vector<Status> statuses(kJobs);
  Result shared;
  Status shared_status;
  std::vector<std::thread> threads;
  for (int i = 0; i < kJobs / 2; ++i)
    threads.emplace_back([&, i] { statuses[i] = client_->Wait(ids[i], 10000, &results[i]); });
  threads.emplace_back([&] { shared_status = client_->Wait(ids[0], 10000, &shared); });
  broker_->Finish(ids);
  for (auto& th : threads) th.join();
  for (int i = kJobs / 2; i < kJobs; ++i) statuses[i] = client_->Wait(ids[i], 10000, &results[i]);

  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
    EXPECT_EQ(results[i].state, JobState::kDone);
    EXPECT_EQ(results[i].id, ids[i]);
    EXPECT_EQ(results[i].batch_size, 100 + i);
  }
  ASSERT_TRUE(shared_status.ok()) << shared_status.ToString();
  EXPECT_EQ(shared.batch_size, 100);
  const int64_t gets = CommandCalls(redis_, "get") - gets_before;
  EXPECT_GE(gets, kJobs);
  EXPECT_LE(gets, kJobs + 1) << "Waits polled Redis instead of reading once after the notice";
}

// Results that come inside FINISHED are returned by Wait without any Redis read; a FINISHED
// that names an id without its record still leads to a read of that one (from Redis).
TEST_F(ClientNoticeTest, InlineResultsInFinishedNeedNoRedisRead) {
  std::vector<SubmitOutcome> outcomes;
  ASSERT_TRUE(
      client_
          ->SubmitMany({MakeJob("m", "inl-1"), MakeJob("m", "inl-2"), MakeJob("m", "inl-3")},
                       &outcomes)
          .ok());
  EXPECT_TRUE(broker_->asked_inline()) << "the SDK asks for inline results";
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
  WriteDone(redis_, ids[2], 42);
  const int64_t reads_before = CommandCalls(redis_, "get");
  broker_->Finish(ids, records);

  Result r0, r1;
  ASSERT_TRUE(client_->Wait(ids[0], 10000, &r0).ok());
  ASSERT_TRUE(client_->Wait(ids[1], 10000, &r1).ok());
  EXPECT_EQ(r0.state, JobState::kDone);
  EXPECT_EQ(r0.id, ids[0]);
  EXPECT_EQ(r0.batch_size, 40);
  ASSERT_EQ(r0.outputs.size(), 1u);
  EXPECT_EQ(r0.outputs[0].As<float>(), (std::vector<float>{1.5f}));
  EXPECT_EQ(r1.batch_size, 41);
  EXPECT_EQ(r1.outputs[0].As<float>(), (std::vector<float>{3.0f}));
  EXPECT_EQ(CommandCalls(redis_, "get"), reads_before) << "inline results were read from Redis";

  Result r2;
  ASSERT_TRUE(client_->Wait(ids[2], 10000, &r2).ok());
  EXPECT_EQ(r2.batch_size, 42);
  EXPECT_GT(CommandCalls(redis_, "get"), reads_before);
}

// A garbled inline record is not trusted: Wait falls back to the record in Redis.
TEST_F(ClientNoticeTest, UndecodableInlineRecordFallsBackToRedis) {
  std::string id;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "garbled-1"), &id).ok());
  WriteDone(redis_, id, 9);
  broker_->Finish({id}, {{id, "not a msgpack result record"}});
  Result result;
  ASSERT_TRUE(client_->Wait(id, 10000, &result).ok());
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_EQ(result.batch_size, 9);
}

// A job this client submitted whose FINISHED notice is lost (e.g. a broker restart) is still
// found by the slow re-check.
TEST_F(ClientNoticeTest, LostNoticeIsCoveredByTheRecheck) {
  std::string id;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "lost-1"), &id).ok());
  WriteDone(redis_, id, 7);  // and no FINISHED
  Result result;
  Status s = client_->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.state, JobState::kDone);
  EXPECT_EQ(result.batch_size, 7);
  // Wait(…, 0) still checks once, also for a job of ours with no notice.
  std::string id2;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "lost-2"), &id2).ok());
  WriteDone(redis_, id2, 8);
  s = client_->Wait(id2, 0, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 8);
}

// Light load: the SUBMIT names this client's channel ("notify": <prefix>notify:<uuid>), the
// client is subscribed to it before the SUBMIT goes out, and a notice published there wakes
// Wait -- here it is the only source: no FINISHED, and nothing in Redis.
TEST_F(ClientNoticeTest, ResultNoticeOnTheNotifyChannelWakesWait) {
  std::string id;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "push-1"), &id).ok());
  const std::string channel = broker_->notify();
  EXPECT_TRUE(protocol::Keys("test:").IsNotifyChannel(channel)) << channel;
  protocol::RedisReply receivers;
  auto c = redis_.Connect();
  ASSERT_TRUE(c->Command({"PUBLISH", channel, Notice(id, DoneRecord(id, 31))}, &receivers).ok());
  EXPECT_EQ(receivers.integer, 1) << "the client was not subscribed when it submitted";
  Result result;
  Status s = client_->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 31);
  EXPECT_EQ(CommandCalls(redis_, "get"), 0);

  // The same channel serves the client's later jobs.
  ASSERT_TRUE(client_->Submit(MakeJob("m", "push-2"), &id).ok());
  EXPECT_EQ(broker_->notify(), channel);
  ASSERT_TRUE(c->Command({"PUBLISH", channel, Notice(id, DoneRecord(id, 32))}, &receivers).ok());
  ASSERT_TRUE(client_->Wait(id, 10000, &result).ok());
  EXPECT_EQ(result.batch_size, 32);
}

// Poll(r.id, &r) and Wait(r.id, ..., &r): the id may be the out-parameter's own, which the call
// overwrites. Before, Poll then read the key of an empty id (always pending), and a Wait that
// timed out crashed on the tracker entry of an empty id.
TEST_F(ClientNoticeTest, PollAndWaitTakeTheIdOfTheirOwnOutParameter) {
  Result r;
  r.id = "aliased-done";
  WriteDone(redis_, r.id, 7);
  ASSERT_TRUE(client_->Poll(r.id, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_EQ(r.id, "aliased-done");
  EXPECT_EQ(r.batch_size, 7);
  Result w;
  w.id = "aliased-never";
  EXPECT_EQ(client_->Wait(w.id, 100, &w).code(), codes::kTimeout);
  EXPECT_EQ(w.id, "aliased-never");
  w.id = "aliased-done";
  ASSERT_TRUE(client_->Wait(w.id, 10000, &w).ok());
  EXPECT_EQ(w.batch_size, 7);
}

// Notices only at light load: a SUBMIT names the channel while the client tracks at most 64 jobs,
// the SUBMIT's own included. So a burst of 65 on an idle client asks for none, 64 do, and one
// more job on top of those 64 does not.
TEST_F(ClientNoticeTest, ANotifyChannelOnlyWhileAtMost64JobsAreTracked) {
  auto submit = [](Client& client, size_t n) {
    std::vector<Job> jobs(n, MakeJob("m"));
    std::vector<SubmitOutcome> outcomes;
    ASSERT_TRUE(client.SubmitMany(jobs, &outcomes).ok());
    for (const auto& o : outcomes) ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  };
  submit(*client_, 65);
  EXPECT_EQ(broker_->notify(), "") << "a burst of 65 asked for notices";
  auto second = MakeClient();
  submit(*second, 64);
  EXPECT_TRUE(protocol::Keys("test:").IsNotifyChannel(broker_->notify())) << broker_->notify();
  submit(*second, 1);
  EXPECT_EQ(broker_->notify(), "") << "the 65th tracked job asked for notices";
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
  testutil::RedisServer redis;
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
TEST_F(ClientNoticeTest, LostSubscriptionFallsBackToRedisAndResubscribes) {
  std::string id;
  ASSERT_TRUE(client_->Submit(MakeJob("m", "resub-1"), &id).ok());
  const std::string channel = broker_->notify();
  ASSERT_FALSE(channel.empty());
  auto c = redis_.Connect();
  protocol::RedisReply reply;
  ASSERT_TRUE(c->Command({"CLIENT", "KILL", "TYPE", "pubsub"}, &reply).ok());
  WriteDone(redis_, id, 41);  // in Redis; its notice is never published
  Result result;
  Status s = client_->Wait(id, 10000, &result);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(result.batch_size, 41);
  // Subscribed again by a SUBMIT made after the client saw the connection close.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string id2;
  int64_t receivers = 0;
  while (receivers == 0 && Clock::now() < deadline) {
    ASSERT_TRUE(client_->Submit(MakeJob("m"), &id2).ok());
    if (broker_->notify().empty()) {
      std::this_thread::sleep_for(milliseconds(100));
      continue;
    }
    const std::string fresh = broker_->notify();
    EXPECT_TRUE(protocol::Keys("test:").IsNotifyChannel(fresh)) << fresh;
    ASSERT_TRUE(c->Command({"PUBLISH", fresh, Notice(id2, DoneRecord(id2, 42))}, &reply).ok());
    receivers = reply.integer;
    if (receivers == 1) EXPECT_NE(fresh, channel);
  }
  ASSERT_EQ(receivers, 1) << "the client did not subscribe again";
  ASSERT_TRUE(client_->Wait(id2, 10000, &result).ok());
  EXPECT_EQ(result.batch_size, 42);
}

}  // namespace
}  // namespace ferry::client
