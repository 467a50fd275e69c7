// ResultWriter against a real redis-server and a real inproc outbox: both write paths (the
// writer thread, and WriteOrSubmit on the caller's thread when the writer is idle) store each
// result once with SET NX and report it in DONE only after the write.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "result_writer.h"
#include "process.h"  // testutil: RedisServer

namespace ferry::worker {
namespace {

constexpr char kOutbox[] = "inproc://result-writer-test";

struct Done {
  std::vector<std::string> ids;
  int64_t duplicates = 0;
  std::vector<std::pair<std::string, std::string>> inline_results;
  std::vector<std::string> notified;
};

JobResult MakeResult(const std::string& id) {
  JobResult r;
  r.job.entry.id = id;
  r.job.entry.model = "tiny";
  r.job.entry.attempt = 1;
  r.status = Status::Ok();  // "done" with no outputs
  r.batch_size = 1;
  return r;
}

std::vector<JobResult> One(const std::string& id) {
  std::vector<JobResult> v;
  v.push_back(MakeResult(id));
  return v;
}

class ResultWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    outbox_.set(zmq::sockopt::rcvtimeo, 10000);
    outbox_.bind(kOutbox);
    ASSERT_TRUE(protocol::ParseRedisUrl(redis_.url(), &endpoint_).ok());
    ASSERT_TRUE(protocol::RedisClient::Connect(endpoint_, 2000, &client_).ok());
    ResultWriter::Options o;
    o.redis = endpoint_;
    o.worker_name = "test-worker";
    o.outbox_address = kOutbox;
    o.backoff_initial_ms = 20;
    o.backoff_max_ms = 100;
    o.hold_notified_ids = hold_notified_ids_;
    writer_ = std::make_unique<ResultWriter>(&context_, o);
    writer_->Start();
  }
  void TearDown() override {
    if (writer_) writer_->Stop();
  }

  // The next DONE the writer handed to the outbox.
  Done NextDone() {
    Done d;
    protocol::Message m;
    Status s = protocol::RecvMessage(outbox_, /*router=*/false, &m, /*dont_wait=*/false);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return d;
    EXPECT_EQ(m.command, "DONE");
    msgpack::object_handle oh;
    EXPECT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    EXPECT_TRUE(protocol::GetStringArray(oh.get(), "ids", &d.ids).ok());
    EXPECT_TRUE(protocol::GetInt(oh.get(), "duplicates", &d.duplicates, 0).ok());
    protocol::InlineResults views;
    EXPECT_TRUE(protocol::DecodeInlineResults(oh.get(), &views).ok());
    for (const auto& [id, record] : views) d.inline_results.emplace_back(id, record);
    EXPECT_TRUE(protocol::DecodeDoneNotified(oh.get(), &d.notified).ok());
    return d;
  }

  // The stored record of `id`, or "" when absent.
  std::string Stored(const std::string& id) {
    std::string value;
    bool found = false;
    EXPECT_TRUE(client_->Get(keys_.Result(id), &value, &found).ok());
    return found ? value : "";
  }

  // Waits until nothing is queued or being written. (A DONE can arrive while its writer still
  // holds the writing role: it lets go right after sending it.)
  void WaitIdle() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (writer_->pending() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(writer_->pending(), 0u);
  }

  // Submits through the writer thread and waits for its DONE: the writer is then connected.
  void WarmUp() {
    writer_->Submit(One("warm-up"));
    ASSERT_EQ(NextDone().ids, std::vector<std::string>{"warm-up"});
    WaitIdle();
  }

  size_t hold_notified_ids_ = 0;  // set before SetUp by fixtures that keep DONEs
  testutil::RedisServer redis_;
  protocol::RedisEndpoint endpoint_;
  std::unique_ptr<protocol::RedisClient> client_;
  protocol::Keys keys_{std::string(protocol::kDefaultPrefix)};
  zmq::context_t context_{1};
  zmq::socket_t outbox_{context_, zmq::socket_type::pull};
  std::unique_ptr<ResultWriter> writer_;
};

TEST_F(ResultWriterTest, IdleWriterLetsTheCallerWriteBeforeItReturns) {
  WarmUp();
  EXPECT_EQ(writer_->written_by_callers(), 0);
  writer_->WriteOrSubmit(One("job-1"));
  // Written on this thread: the record is in Redis as the call returns, no waiting.
  const std::string record = Stored("job-1");
  ASSERT_FALSE(record.empty());
  EXPECT_EQ(writer_->written_by_callers(), 1);
  EXPECT_EQ(writer_->written(), 2);
  EXPECT_EQ(writer_->pending(), 0u);
  Result decoded;
  ASSERT_TRUE(protocol::DecodeResult(record.data(), record.size(), &decoded).ok());
  EXPECT_EQ(decoded.id, "job-1");
  EXPECT_EQ(decoded.state, JobState::kDone);
  EXPECT_EQ(decoded.worker, "test-worker");
  // DONE follows, carrying the very bytes Redis holds.
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-1"});
  EXPECT_EQ(d.duplicates, 0);
  ASSERT_EQ(d.inline_results.size(), 1u);
  EXPECT_EQ(d.inline_results[0].second, record);
}

TEST_F(ResultWriterTest, CallerWriteKeepsTheFirstResultAndReportsTheDuplicate) {
  WarmUp();
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("job-2"), "earlier"}, &reply).ok());
  writer_->WriteOrSubmit(One("job-2"));
  EXPECT_EQ(Stored("job-2"), "earlier");
  EXPECT_EQ(writer_->duplicates(), 1);
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-2"});
  EXPECT_EQ(d.duplicates, 1);
  EXPECT_TRUE(d.inline_results.empty());  // never inline a result Redis does not hold
}

TEST_F(ResultWriterTest, CallersFailedTryIsRetriedByTheWriterThreadAndDoneFollowsTheWrite) {
  WarmUp();
  redis_.Stop();
  writer_->WriteOrSubmit(One("job-3"));  // the one try fails; the writer thread takes over
  EXPECT_EQ(writer_->written_by_callers(), 0);
  EXPECT_EQ(writer_->pending(), 1u);
  // No DONE while Redis is down.
  zmq::message_t part;
  outbox_.set(zmq::sockopt::rcvtimeo, 300);
  EXPECT_FALSE(outbox_.recv(part).has_value());
  outbox_.set(zmq::sockopt::rcvtimeo, 10000);
  redis_.Restart();
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-3"});
  // A retry cannot tell its own earlier write from another's: nothing counted, nothing inlined.
  EXPECT_EQ(d.duplicates, 0);
  EXPECT_TRUE(d.inline_results.empty());
  ASSERT_TRUE(protocol::RedisClient::Connect(endpoint_, 2000, &client_).ok());
  EXPECT_FALSE(Stored("job-3").empty());
  WaitIdle();
  EXPECT_EQ(writer_->written(), 2);
}

// Two threads call WriteOrSubmit like idle executors (paced, so that the writer is often idle
// and they take the writing role), two Submit: every id is reported exactly once.
TEST_F(ResultWriterTest, ManyCallersAndTheThreadEachWriteEveryResultOnce) {
  WarmUp();
  constexpr int kThreads = 4, kPerThread = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (t % 2) writer_->WriteOrSubmit(One(id));
        else writer_->Submit(One(id));
        std::this_thread::sleep_for(std::chrono::microseconds(500 + 300 * t));
      }
    });
  }
  for (auto& th : threads) th.join();
  std::map<std::string, int> reported;
  while (static_cast<int>(reported.size()) < kThreads * kPerThread) {
    Done d = NextDone();
    if (d.ids.empty()) break;  // timed out (the expectation in NextDone failed)
    for (const auto& id : d.ids) ++reported[id];
  }
  ASSERT_EQ(static_cast<int>(reported.size()), kThreads * kPerThread);
  for (const auto& [id, n] : reported) {
    EXPECT_EQ(n, 1) << id;
    EXPECT_FALSE(Stored(id).empty()) << id;
  }
  WaitIdle();
  EXPECT_EQ(writer_->written(), 1 + kThreads * kPerThread);
  EXPECT_EQ(writer_->duplicates(), 0);
  EXPECT_GT(writer_->written_by_callers(), 0);  // the callers' path was taken, not just queued
}

// A job whose CHUNK named a "notify" channel: the write also publishes the result notice there
// (a FINISHED body with the very record Redis holds), and DONE lists it as notified (without an
// inline copy: its producer has it). A losing duplicate is neither published nor notified: the
// first notice on the channel afterwards is the next job's.
TEST_F(ResultWriterTest, NotifyJobsArePublishedWithTheStoredRecordDuplicatesAreNot) {
  const std::string channel = "ferry:notify:writer-test";
  std::unique_ptr<protocol::RedisSubscriber> sub;
  ASSERT_TRUE(protocol::RedisSubscriber::Connect(endpoint_, 2000, channel, &sub).ok());
  // The next notice on the channel: its ids and records.
  auto next_notice = [&](std::vector<std::string>* ids,
                         std::vector<std::pair<std::string, std::string>>* records) {
    std::string payload;
    ASSERT_TRUE(testutil::NextPubSubMessage(sub.get(), &payload)) << "no notice";
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(payload.data(), payload.size(), &oh).ok());
    ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", ids).ok());
    protocol::InlineResults views;
    ASSERT_TRUE(protocol::DecodeInlineResults(oh.get(), &views).ok());
    records->clear();
    for (const auto& [id, record] : views) records->emplace_back(id, record);
  };
  auto notify_job = [&](const std::string& id) {
    std::vector<JobResult> v = One(id);
    v[0].job.entry.notify = channel;
    return v;
  };
  WarmUp();

  writer_->WriteOrSubmit(notify_job("job-n1"));
  std::vector<std::string> ids;
  std::vector<std::pair<std::string, std::string>> records;
  next_notice(&ids, &records);
  EXPECT_EQ(ids, std::vector<std::string>{"job-n1"});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].first, "job-n1");
  EXPECT_EQ(records[0].second, Stored("job-n1"));
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-n1"});
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-n1"});
  EXPECT_TRUE(d.inline_results.empty());

  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("job-n2"), "earlier"}, &reply).ok());
  writer_->WriteOrSubmit(notify_job("job-n2"));
  EXPECT_EQ(Stored("job-n2"), "earlier");
  d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-n2"});
  EXPECT_EQ(d.duplicates, 1);
  EXPECT_TRUE(d.notified.empty());
  writer_->WriteOrSubmit(notify_job("job-n3"));
  next_notice(&ids, &records);
  EXPECT_EQ(ids, std::vector<std::string>{"job-n3"}) << "the duplicate was announced";
  d = NextDone();
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-n3"});
}

// A write with notices starts with a PING, so that Redis -- which writes one turn's replies
// newest-queued first -- sends the producers' notices before this worker's replies; a write without
// notices has none. The PING's reply is not counted as one of the results' (the test above checks
// that the stored/duplicate verdicts still line up).
TEST_F(ResultWriterTest, WritesWithNoticesLeadWithOnePing) {
  WarmUp();
  protocol::RedisReply reply;
  // Calls of `command` since the last CONFIG RESETSTAT, from INFO commandstats.
  auto calls = [&](const std::string& command) -> int64_t {
    protocol::RedisReply info;
    EXPECT_TRUE(client_->Command({"INFO", "commandstats"}, &info).ok());
    const std::string key = "cmdstat_" + command + ":calls=";
    const size_t at = info.str.find(key);
    return at == std::string::npos ? 0 : std::stoll(info.str.substr(at + key.size()));
  };
  ASSERT_TRUE(client_->Command({"CONFIG", "RESETSTAT"}, &reply).ok());
  writer_->WriteOrSubmit(One("job-plain"));
  EXPECT_EQ(NextDone().ids, std::vector<std::string>{"job-plain"});
  EXPECT_EQ(calls("set"), 1);
  EXPECT_EQ(calls("ping"), 0);

  std::vector<JobResult> v = One("job-notified");
  v[0].job.entry.notify = "ferry:notify:ping-test";
  writer_->WriteOrSubmit(std::move(v));
  const Done d = NextDone();
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-notified"});
  EXPECT_EQ(calls("eval"), 1);
  EXPECT_EQ(calls("ping"), 1);

  // One write of a plain job, a notified job and a notified losing duplicate: each job keeps its
  // own verdict (the PING's reply is not taken for the first job's).
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("job-m3"), "earlier"}, &reply).ok());
  std::vector<JobResult> mixed;
  mixed.push_back(MakeResult("job-m1"));
  mixed.push_back(MakeResult("job-m2"));
  mixed.back().job.entry.notify = "ferry:notify:ping-test";
  mixed.push_back(MakeResult("job-m3"));
  mixed.back().job.entry.notify = "ferry:notify:ping-test";
  writer_->WriteOrSubmit(std::move(mixed));
  const Done m = NextDone();
  EXPECT_EQ(m.ids, (std::vector<std::string>{"job-m1", "job-m2", "job-m3"}));
  EXPECT_EQ(m.duplicates, 1);
  EXPECT_EQ(m.notified, std::vector<std::string>{"job-m2"});
  EXPECT_EQ(Stored("job-m3"), "earlier");
  EXPECT_FALSE(Stored("job-m1").empty());
  EXPECT_EQ(calls("ping"), 2);
}

// A Redis that refuses scripts (here an ACL without EVAL) still gets every result: the writer
// falls back to plain SET NX, and DONE then lists nothing as notified (the broker's FINISHED
// tells the producer).
TEST_F(ResultWriterTest, RedisWithoutScriptsGetsPlainWritesAndNoNotices) {
  WarmUp();
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"ACL", "SETUSER", "default", "-eval"}, &reply).ok());
  std::vector<JobResult> v = One("job-acl");
  v[0].job.entry.notify = "ferry:notify:writer-test";
  writer_->WriteOrSubmit(std::move(v));
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-acl"});
  EXPECT_TRUE(d.notified.empty());
  const std::string record = Stored("job-acl");
  ASSERT_FALSE(record.empty());
  Result decoded;
  ASSERT_TRUE(protocol::DecodeResult(record.data(), record.size(), &decoded).ok());
  EXPECT_EQ(decoded.id, "job-acl");
}

// With hold_notified_ids (as the worker sets it), a DONE whose jobs were all notified is kept in
// the writer for BrokerLink to take, not handed to the outbox; the next DONE that goes out
// (one not all notified, or one that would pass the bound of 2 here) carries the kept ids first.
class ResultWriterKeepTest : public ResultWriterTest {
 protected:
  void SetUp() override {
    hold_notified_ids_ = 2;
    ResultWriterTest::SetUp();
  }
  // Writes one job whose producer asked for a notice (on a channel nobody listens to: PUBLISH
  // does not care) and waits until it is written and reported.
  void WriteNotified(const std::string& id, Status status = Status::Ok()) {
    std::vector<JobResult> v = One(id);
    v[0].job.entry.notify = "ferry:notify:keep-test";
    v[0].status = std::move(status);
    writer_->WriteOrSubmit(std::move(v));
    WaitIdle();
  }
};

TEST_F(ResultWriterKeepTest, NotifiedDonesAreKeptForTheLinkOrRideAlongWithTheNextDone) {
  WarmUp();
  EXPECT_EQ(writer_->held_since_us(), 0);
  ResultWriter::HeldDone held;
  EXPECT_FALSE(writer_->TakeHeldDone(&held));

  // Kept, then taken (as BrokerLink does).
  WriteNotified("k1");
  EXPECT_FALSE(Stored("k1").empty());
  EXPECT_GT(writer_->held_since_us(), 0);
  ASSERT_TRUE(writer_->TakeHeldDone(&held));
  EXPECT_EQ(held.ids, std::vector<std::string>{"k1"});
  EXPECT_TRUE(held.not_done.empty());
  EXPECT_GT(held.since_us, 0);
  EXPECT_EQ(writer_->held_since_us(), 0);
  EXPECT_FALSE(writer_->TakeHeldDone(&held));

  // Kept, then carried by the next plain DONE (which proves k1 never went to the outbox).
  WriteNotified("k2");
  writer_->WriteOrSubmit(One("p1"));
  Done d = NextDone();
  EXPECT_EQ(d.ids, (std::vector<std::string>{"k2", "p1"}));
  EXPECT_EQ(d.notified, std::vector<std::string>{"k2"});
  ASSERT_EQ(d.inline_results.size(), 1u);  // p1's record rides inline; k2's producer has it
  EXPECT_EQ(d.inline_results[0].first, "p1");
  WaitIdle();
  EXPECT_EQ(writer_->held_since_us(), 0);

  // The bound: two kept; a third would pass it, so all three go out together.
  WriteNotified("k3");
  WriteNotified("k4");
  WriteNotified("k5");
  d = NextDone();
  EXPECT_EQ(d.ids, (std::vector<std::string>{"k3", "k4", "k5"}));
  EXPECT_EQ(d.notified, (std::vector<std::string>{"k3", "k4", "k5"}));
  EXPECT_EQ(writer_->held_since_us(), 0);

  // A failed job's status is kept with its id (for the broker's per-status counts).
  WriteNotified("k6", Status(codes::kInvalidArgument, "bad input"));
  ASSERT_TRUE(writer_->TakeHeldDone(&held));
  EXPECT_EQ(held.ids, std::vector<std::string>{"k6"});
  ASSERT_EQ(held.not_done.size(), 1u);
  EXPECT_EQ(held.not_done[0].first, "k6");
  EXPECT_EQ(held.not_done[0].second, "failed");
}

// A collector (BrokerLink) that sleeps without looking in time gets one wake-up on the outbox
// when the first id is kept, and none for the ids kept after it.
TEST_F(ResultWriterKeepTest, SleepingCollectorIsWokenOnceForTheFirstKeptId) {
  WarmUp();
  writer_->SetCollectorAsleep(true);
  WriteNotified("w1");
  WriteNotified("w2");
  protocol::Message m;
  ASSERT_TRUE(protocol::RecvMessage(outbox_, /*router=*/false, &m, /*dont_wait=*/false).ok());
  EXPECT_EQ(m.command, ResultWriter::kKeptWake);
  writer_->SetCollectorAsleep(false);
  ResultWriter::HeldDone held;
  ASSERT_TRUE(writer_->TakeHeldDone(&held));
  EXPECT_EQ(held.ids, (std::vector<std::string>{"w1", "w2"}));
  // Awake: keeping sends nothing; the next thing on the outbox is the next plain DONE.
  WriteNotified("w3");
  writer_->WriteOrSubmit(One("p2"));
  Done d = NextDone();
  EXPECT_EQ(d.ids, (std::vector<std::string>{"w3", "p2"}));
}

// Kept ids are not lost when the writer stops with some still kept: Stop hands them over.
TEST_F(ResultWriterKeepTest, StopHandsOverWhatIsStillKept) {
  WarmUp();
  WriteNotified("k7");
  ASSERT_GT(writer_->held_since_us(), 0);  // kept, not handed over yet
  writer_->Stop();
  Done d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"k7"});
  EXPECT_EQ(d.notified, std::vector<std::string>{"k7"});
  writer_.reset();
}

}  // namespace
}  // namespace ferry::worker
