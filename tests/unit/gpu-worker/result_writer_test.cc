// ResultWriter against a real redis-server, with a real Outbox behind it: each result is stored
// once with SET NX (the notice script for jobs with a "notify" channel), and its DONE report
// reaches the outbox only after the write, carrying the very bytes Redis holds.
#include "result_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "outbox.h"
#include "process.h"  // testutil: RedisServer, WaitFor, NextPubSubMessage

namespace ferry::worker {
namespace {

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
    ASSERT_TRUE(outbox_.Init().ok());
    client_ = redis_.Connect();
    ASSERT_NE(client_, nullptr);
    ResultWriter::Options o;
    o.redis = redis_.endpoint();
    o.worker_name = "test-worker";
    o.backoff_initial_ms = 20;
    o.backoff_max_ms = 100;
    writer_ = std::make_unique<ResultWriter>(o, &outbox_);
    writer_->Start();
  }
  void TearDown() override {
    if (writer_) writer_->Stop();
  }

  // The next DONE report the writer handed to the outbox (within 10 s; empty ids otherwise).
  DoneReport NextDone() {
    if (reports_.empty()) {
      testutil::WaitFor(
          [&] {
            bool ready = false;
            outbox_.TakeAll(&reports_, &ready);
            return !reports_.empty();
          },
          std::chrono::seconds(10));
    }
    if (reports_.empty()) {
      ADD_FAILURE() << "no DONE report";
      return {};
    }
    DoneReport d = std::move(reports_.front());
    reports_.erase(reports_.begin());
    return d;
  }
  // Whether a report comes within `ms`.
  bool AnyDoneWithin(int ms) {
    const bool any = testutil::WaitFor(
        [&] {
          bool ready = false;
          outbox_.TakeAll(&reports_, &ready);
          return !reports_.empty();
        },
        std::chrono::milliseconds(ms));
    return any;
  }

  // The stored record of `id`, or "" when absent.
  std::string Stored(const std::string& id) {
    std::string value;
    bool found = false;
    EXPECT_TRUE(client_->Get(keys_.Result(id), &value, &found).ok());
    return found ? value : "";
  }

  // Waits until nothing is queued or being written.
  void WaitIdle() {
    ASSERT_TRUE(testutil::WaitFor([&] { return writer_->pending() == 0; }));
  }

  testutil::RedisServer redis_;
  std::unique_ptr<protocol::RedisClient> client_;
  protocol::Keys keys_{std::string(protocol::kDefaultPrefix)};
  Outbox outbox_{1024};
  std::vector<DoneReport> reports_;  // taken from the outbox, not yet looked at
  std::unique_ptr<ResultWriter> writer_;
};

TEST_F(ResultWriterTest, WritesThenReportsTheStoredBytes) {
  writer_->Submit(One("job-1"));
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-1"});
  EXPECT_EQ(d.duplicates, 0);
  const std::string record = Stored("job-1");  // in Redis before the report was handed over
  ASSERT_FALSE(record.empty());
  Result decoded;
  ASSERT_TRUE(protocol::DecodeResult(record.data(), record.size(), &decoded).ok());
  EXPECT_EQ(decoded.id, "job-1");
  EXPECT_EQ(decoded.state, JobState::kDone);
  EXPECT_EQ(decoded.worker, "test-worker");
  ASSERT_EQ(d.inline_results.size(), 1u);
  EXPECT_EQ(d.inline_results[0].first, "job-1");
  EXPECT_EQ(d.inline_results[0].second, record);
  WaitIdle();
  EXPECT_EQ(writer_->written(), 1);
}

// Redis drops the connection on a value over 512 MiB (proto-max-bulk-len): written, such a
// record would look like Redis down forever and hold every result behind it. The job fails
// too_large instead, without its outputs' bytes ever being read, and the next result is written.
TEST_F(ResultWriterTest, OutputsTooBigForARedisValueFailTheJobAndTheNextIsWritten) {
  std::vector<JobResult> results = One("huge");
  const size_t bytes = size_t{600} << 20;
  static const char kOneByte = 0;  // never read: the size alone decides
  results[0].outputs.push_back(
      {DType::kUInt8, {static_cast<int64_t>(bytes)}, &kOneByte, bytes, false, false});
  results.push_back(MakeResult("after"));
  writer_->Submit(std::move(results));
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, (std::vector<std::string>{"huge", "after"}));
  ASSERT_EQ(d.not_done.size(), 1u);
  EXPECT_EQ(d.not_done[0].first, "huge");
  Result decoded;
  const std::string record = Stored("huge");
  ASSERT_TRUE(protocol::DecodeResult(record.data(), record.size(), &decoded).ok());
  EXPECT_EQ(decoded.state, JobState::kFailed);
  EXPECT_EQ(decoded.error.code(), codes::kTooLarge) << decoded.error.ToString();
  EXPECT_NE(decoded.error.message().find("629145600 bytes"), std::string::npos)
      << decoded.error.message();
  EXPECT_FALSE(Stored("after").empty());
}

TEST_F(ResultWriterTest, KeepsTheFirstResultAndReportsTheDuplicate) {
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("job-2"), "earlier"}, &reply).ok());
  writer_->Submit(One("job-2"));
  DoneReport d = NextDone();
  EXPECT_EQ(Stored("job-2"), "earlier");
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-2"});
  EXPECT_EQ(d.duplicates, 1);
  EXPECT_TRUE(d.inline_results.empty());  // never inline a result Redis does not hold
  EXPECT_EQ(writer_->duplicates(), 1);
}

TEST_F(ResultWriterTest, RedisDownKeepsTheResultsAndDoneFollowsTheWrite) {
  writer_->Submit(One("warm-up"));  // connected
  ASSERT_EQ(NextDone().ids, std::vector<std::string>{"warm-up"});
  redis_.Stop();
  writer_->Submit(One("job-3"));
  EXPECT_FALSE(AnyDoneWithin(300)) << "DONE while Redis is down";
  EXPECT_EQ(writer_->pending(), 1u);
  redis_.Restart();
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-3"});
  // The attempts while Redis was down got no answer; the one that got OK stored the record: it
  // rides inline, and nothing is counted as a duplicate.
  EXPECT_EQ(d.duplicates, 0);
  ASSERT_EQ(d.inline_results.size(), 1u);
  EXPECT_EQ(d.inline_results[0].first, "job-3");
  client_ = redis_.Connect();
  ASSERT_NE(client_, nullptr);
  EXPECT_FALSE(Stored("job-3").empty());
  EXPECT_EQ(d.inline_results[0].second, Stored("job-3"));
  WaitIdle();
  EXPECT_EQ(writer_->written(), 2);
}

// Several threads submit at once (as executors do): every id is reported exactly once.
TEST_F(ResultWriterTest, ManySubmittersEachResultReportedOnce) {
  constexpr int kThreads = 4, kPerThread = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kPerThread; ++i)
        writer_->Submit(One("t" + std::to_string(t) + "-" + std::to_string(i)));
    });
  }
  for (auto& th : threads) th.join();
  std::map<std::string, int> reported;
  while (static_cast<int>(reported.size()) < kThreads * kPerThread) {
    DoneReport d = NextDone();
    if (d.ids.empty()) break;  // timed out (NextDone failed the test)
    for (const auto& id : d.ids) ++reported[id];
  }
  ASSERT_EQ(static_cast<int>(reported.size()), kThreads * kPerThread);
  for (const auto& [id, n] : reported) {
    EXPECT_EQ(n, 1) << id;
    EXPECT_FALSE(Stored(id).empty()) << id;
  }
  WaitIdle();
  EXPECT_EQ(writer_->written(), kThreads * kPerThread);
  EXPECT_EQ(writer_->duplicates(), 0);
}

// A job whose CHUNK named a "notify" channel: the write also publishes the result notice there
// (a FINISHED body with the very record Redis holds), and DONE lists it as notified (without an
// inline copy: its producer has it). A losing duplicate is neither published nor notified: the
// first notice on the channel afterwards is the next job's.
// A subscriber on a notify channel, and the notices it receives: ids and inline records.
class NoticeListener {
 public:
  NoticeListener(const protocol::RedisEndpoint& ep, std::string channel)
      : channel_(std::move(channel)) {
    EXPECT_TRUE(protocol::RedisSubscriber::Connect(ep, 2000, channel_, &sub_).ok());
  }
  const std::string& channel() const { return channel_; }
  void Next(std::vector<std::string>* ids,
            std::vector<std::pair<std::string, std::string>>* records) {
    std::string payload;
    ASSERT_TRUE(testutil::NextPubSubMessage(sub_.get(), &payload)) << "no notice";
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(payload.data(), payload.size(), &oh).ok());
    ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", ids).ok());
    protocol::InlineResults views;
    ASSERT_TRUE(protocol::DecodeInlineResults(oh.get(), &views).ok());
    records->clear();
    for (const auto& [id, record] : views) records->emplace_back(id, record);
  }

 private:
  std::string channel_;
  std::unique_ptr<protocol::RedisSubscriber> sub_;
};

// Calls of `command` since the last CONFIG RESETSTAT, from INFO commandstats.
int64_t Calls(protocol::RedisClient& c, const std::string& command) {
  protocol::RedisReply info;
  EXPECT_TRUE(c.Command({"INFO", "commandstats"}, &info).ok());
  const std::string key = "cmdstat_" + command + ":calls=";
  const size_t at = info.str.find(key);
  return at == std::string::npos ? 0 : std::stoll(info.str.substr(at + key.size()));
}

// Calls of `command` Redis refused before running them (OOM, ...), from INFO commandstats.
int64_t Rejected(protocol::RedisClient& c, const std::string& command) {
  protocol::RedisReply info;
  EXPECT_TRUE(c.Command({"INFO", "commandstats"}, &info).ok());
  const size_t at = info.str.find("cmdstat_" + command + ":");
  if (at == std::string::npos) return 0;
  const std::string line = info.str.substr(at, info.str.find('\n', at) - at);
  const size_t field = line.find("rejected_calls=");
  return field == std::string::npos ? 0 : std::stoll(line.substr(field + 15));
}

TEST_F(ResultWriterTest, NotifyJobsArePublishedWithTheStoredRecordDuplicatesAreNot) {
  NoticeListener listener(redis_.endpoint(), "ferry:notify:writer-test");
  const std::string channel = listener.channel();
  auto next_notice = [&](std::vector<std::string>* ids,
                         std::vector<std::pair<std::string, std::string>>* records) {
    listener.Next(ids, records);
  };
  auto notify_job = [&](const std::string& id) {
    std::vector<JobResult> v = One(id);
    v[0].job.entry.notify = channel;
    return v;
  };

  writer_->Submit(notify_job("job-n1"));
  std::vector<std::string> ids;
  std::vector<std::pair<std::string, std::string>> records;
  next_notice(&ids, &records);
  EXPECT_EQ(ids, std::vector<std::string>{"job-n1"});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].first, "job-n1");
  EXPECT_EQ(records[0].second, Stored("job-n1"));
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-n1"});
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-n1"});
  EXPECT_TRUE(d.inline_results.empty());

  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("job-n2"), "earlier"}, &reply).ok());
  writer_->Submit(notify_job("job-n2"));
  EXPECT_EQ(Stored("job-n2"), "earlier");
  d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-n2"});
  EXPECT_EQ(d.duplicates, 1);
  EXPECT_TRUE(d.notified.empty());
  writer_->Submit(notify_job("job-n3"));
  next_notice(&ids, &records);
  EXPECT_EQ(ids, std::vector<std::string>{"job-n3"}) << "the duplicate was announced";
  d = NextDone();
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-n3"});
}

// A record bigger than inline_result_bytes (16 KiB) is not put through the script (Lua would copy
// it in and out): SET NX, then PUBLISH of a notice without the record, in one pipeline. The
// notice comes after the write, DONE lists the job as notified, and nothing is inlined.
TEST_F(ResultWriterTest, BigRecordsAreWrittenPlainAndNoticedWithoutTheRecord) {
  NoticeListener listener(redis_.endpoint(), "ferry:notify:big");
  auto owner = std::make_shared<std::string>(20000, 'x');
  std::vector<JobResult> v = One("job-big");
  v[0].job.entry.notify = listener.channel();
  v[0].outputs.push_back(protocol::TensorRef{DType::kUInt8, {20000}, owner->data(), owner->size()});
  v[0].outputs_owner = owner;
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"CONFIG", "RESETSTAT"}, &reply).ok());
  writer_->Submit(std::move(v));
  std::vector<std::string> ids;
  std::vector<std::pair<std::string, std::string>> records;
  listener.Next(&ids, &records);
  EXPECT_EQ(ids, std::vector<std::string>{"job-big"});
  EXPECT_TRUE(records.empty()) << "a big record rode in the notice";
  const std::string stored = Stored("job-big");  // readable when the notice came
  Result decoded;
  ASSERT_TRUE(protocol::DecodeResult(stored.data(), stored.size(), &decoded).ok());
  ASSERT_EQ(decoded.outputs.size(), 1u);
  EXPECT_EQ(decoded.outputs[0].data, *owner);
  DoneReport d = NextDone();
  EXPECT_EQ(d.notified, std::vector<std::string>{"job-big"});
  EXPECT_TRUE(d.inline_results.empty());
  EXPECT_EQ(Calls(*client_, "eval"), 0);
  EXPECT_EQ(Calls(*client_, "set"), 1);
  EXPECT_EQ(Calls(*client_, "publish"), 1);
}

// A Redis that refuses scripts (here an ACL without EVAL) still gets every result: the writer
// falls back to plain SET NX, and DONE then lists nothing as notified (the broker's FINISHED
// tells the producer).
TEST_F(ResultWriterTest, RedisWithoutScriptsGetsPlainWritesAndNoNotices) {
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"ACL", "SETUSER", "default", "-eval"}, &reply).ok());
  std::vector<JobResult> v = One("job-acl");
  v[0].job.entry.notify = "ferry:notify:writer-test";
  writer_->Submit(std::move(v));
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-acl"});
  EXPECT_TRUE(d.notified.empty());
  const std::string record = Stored("job-acl");
  ASSERT_FALSE(record.empty());
  Result decoded;
  ASSERT_TRUE(protocol::DecodeResult(record.data(), record.size(), &decoded).ok());
  EXPECT_EQ(decoded.id, "job-acl");
}

// Redis at maxmemory (noeviction) refuses the result's SET with OOM but would take a DEL: the
// job's stored inputs stay until its result is in Redis, so that a worker that died meanwhile
// leaves a job another worker can still run. Once Redis takes the SET, the inputs go: after the
// DONE (in a round of their own, the writer being idle; with the next batch's writes, busy).
TEST_F(ResultWriterTest, StoredInputsStayUntilTheResultIsStored) {
  protocol::RedisReply reply;
  const std::string input = keys_.Input("job-oom", 0);
  ASSERT_TRUE(client_->Command({"SET", input, "the input's bytes"}, &reply).ok());
  ASSERT_TRUE(client_->Command({"CONFIG", "RESETSTAT"}, &reply).ok());
  ASSERT_TRUE(client_->Command({"CONFIG", "SET", "maxmemory", "1"}, &reply).ok());
  std::vector<JobResult> v = One("job-oom");
  v[0].job.entry.stored_inputs = {0};
  writer_->Submit(std::move(v));
  // Two rounds refused (OOM: commandstats count it as rejected): the second a retry.
  ASSERT_TRUE(testutil::WaitFor([&] { return Rejected(*client_, "set") >= 2; }));
  EXPECT_EQ(Calls(*client_, "del"), 0);
  ASSERT_TRUE(client_->Command({"EXISTS", input}, &reply).ok());
  EXPECT_EQ(reply.integer, 1) << "the inputs went while the result was refused";
  EXPECT_FALSE(AnyDoneWithin(0));
  ASSERT_TRUE(client_->Command({"CONFIG", "SET", "maxmemory", "0"}, &reply).ok());
  DoneReport d = NextDone();
  EXPECT_EQ(d.ids, std::vector<std::string>{"job-oom"});
  EXPECT_FALSE(Stored("job-oom").empty());
  EXPECT_TRUE(testutil::WaitFor([&] {
    protocol::RedisReply exists;
    return client_->Command({"EXISTS", input}, &exists).ok() && exists.integer == 0;
  })) << "the inputs stayed after the result was stored";
}

}  // namespace
}  // namespace ferry::worker
