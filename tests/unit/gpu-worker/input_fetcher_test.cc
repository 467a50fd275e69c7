// The worker's InputFetcher (gpu-worker/src) against a real redis-server: jobs whose inputs the
// producer stored in Redis reach the JobQueue with their bytes in place; a missing or wrongly
// sized input fails its job (through the ResultWriter, to Redis); so does a key Redis refuses
// to read (WRONGTYPE) or an input too big to hold, and the fetcher goes on with the next jobs;
// Redis down or busy: the jobs wait, and Stop gives up after its timeout.
#include "input_fetcher.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "job_queue.h"
#include "outbox.h"
#include "process.h"  // testutil: RedisServer, WaitFor
#include "result_writer.h"

namespace ferry::worker {
namespace {

class InputFetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(outbox_.Init().ok());
    client_ = redis_.Connect();
    ASSERT_NE(client_, nullptr);
    ResultWriter::Options wo;
    wo.redis = redis_.endpoint();
    wo.worker_name = "fetch-test";
    writer_ = std::make_unique<ResultWriter>(wo, &outbox_);
    writer_->Start();
    InputFetcher::Options fo;
    fo.redis = redis_.endpoint();
    fo.backoff_initial_ms = 20;
    fo.backoff_max_ms = 100;
    fo.stop_timeout_ms = 500;
    fetcher_ = std::make_unique<InputFetcher>(fo, &queue_, writer_.get());
    fetcher_->Start();
  }
  void TearDown() override {
    fetcher_->Stop();
    writer_->Stop();
  }

  // A job of `n` int16 inputs [4]; those in `stored` are stored (no bytes in the job), the
  // others carry `small`.
  Job MakeJob(const std::string& id, int n, const std::vector<int32_t>& stored) {
    Job job;
    job.entry.id = id;
    job.entry.model = "m";
    for (int i = 0; i < n; ++i) {
      protocol::TensorRef t;
      t.dtype = DType::kInt16;
      t.shape = {4};
      t.size = 8;
      t.stored = std::find(stored.begin(), stored.end(), i) != stored.end();
      t.data = t.stored ? nullptr : small_.data();
      job.entry.inputs.push_back(t);
    }
    job.entry.stored_inputs = stored;
    return job;
  }
  // The jobs the queue holds, waiting up to 10 s for `n` of them (fewer when they do not come).
  std::vector<Job> Take(size_t n) {
    std::vector<Job> got;
    while (got.size() < n &&
           testutil::WaitFor([&] { return queue_.size() > 0; }, std::chrono::seconds(10))) {
      std::vector<Job> more;
      if (!queue_.TakeBatch(64, &more)) break;
      for (auto& j : more) got.push_back(std::move(j));
    }
    return got;
  }
  // Waits until `id` has a result record in Redis and returns it.
  Result Finished(const std::string& id) {
    EXPECT_TRUE(testutil::WaitFor([&] { return Stored(id).state != JobState::kPending; },
                                  std::chrono::seconds(10)))
        << id << " has no result";
    return Stored(id);
  }
  // How many times the DONE reports name `id`, waiting up to 10 s for `n` (this test stands in
  // for the I/O thread that takes them).
  size_t Reported(const std::string& id, size_t n) {
    size_t count = 0;
    testutil::WaitFor(
        [&] {
          std::vector<DoneReport> reports;
          bool ready = false;
          outbox_.TakeAll(&reports, &ready);
          for (const auto& r : reports) count += std::count(r.ids.begin(), r.ids.end(), id);
          return count >= n;
        },
        std::chrono::seconds(10));
    return count;
  }
  void Put(const std::string& key, const std::string& value) {
    protocol::RedisReply r;
    ASSERT_TRUE(client_->Command({"SET", key, value}, &r).ok());
  }
  // The result record of `id` in Redis, decoded (state kPending when there is none).
  Result Stored(const std::string& id) {
    Result r;
    std::string value;
    bool found = false;
    EXPECT_TRUE(client_->Get(keys_.Result(id), &value, &found).ok());
    if (found) {
      EXPECT_TRUE(protocol::DecodeResult(value.data(), value.size(), &r).ok());
    }
    return r;
  }

  const std::string small_ = std::string(8, 's');
  testutil::RedisServer redis_{[] {  // values survive a restart
    testutil::RedisServer::Options o;
    o.append_only = true;
    return o;
  }()};
  std::unique_ptr<protocol::RedisClient> client_;
  protocol::Keys keys_;
  JobQueue queue_{64};
  Outbox outbox_{64};
  std::unique_ptr<ResultWriter> writer_;
  std::unique_ptr<InputFetcher> fetcher_;
};

TEST_F(InputFetcherTest, StoredInputsReachTheQueueWithTheirBytes) {
  Put(keys_.Input("f-1", 1), "ABCDEFGH");
  Put(keys_.Input("f-2", 0), "12345678");
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("f-1", 2, {1}));
  jobs.push_back(MakeJob("f-2", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::vector<Job> got;
  ASSERT_TRUE(queue_.TakeBatch(8, &got));
  if (got.size() < 2) {  // both came in one turn, but be lenient about the queue's batching
    std::vector<Job> more;
    ASSERT_TRUE(queue_.TakeBatch(8, &more));
    for (auto& j : more) got.push_back(std::move(j));
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), small_);
  EXPECT_EQ(std::string(got[0].entry.inputs[1].data, 8), "ABCDEFGH");
  EXPECT_EQ(std::string(got[1].entry.inputs[0].data, 8), "12345678");
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
}

// Jobs fetched together get their stored inputs in one buffer per model, input by input: every
// job's input 0 back to back, then every job's input 1, each run aligned -- a batch of them is
// already stacked (the model reads it in place on the CPU: batcher_test.cc). A job of another
// model among them does not sit in between.
TEST_F(InputFetcherTest, InputsOfJobsFetchedTogetherLieBackToBackPerModel) {
  const std::vector<std::string> ids = {"b-1", "other-1", "b-2", "b-3"};
  for (size_t j = 0; j < ids.size(); ++j) {
    Put(keys_.Input(ids[j], 0), std::string(8, static_cast<char>('a' + j)));
    Put(keys_.Input(ids[j], 2), std::string(8, static_cast<char>('A' + j)));
  }
  std::vector<Job> jobs;
  for (const auto& id : ids) jobs.push_back(MakeJob(id, 3, {0, 2}));
  jobs[1].entry.model = "other";
  fetcher_->Submit(std::move(jobs));  // one Submit: one fetch
  std::vector<Job> got;
  while (got.size() < ids.size()) {
    std::vector<Job> more;
    ASSERT_TRUE(queue_.TakeBatch(8, &more));
    for (auto& j : more) got.push_back(std::move(j));
  }
  std::sort(got.begin(), got.end(),
            [&](const Job& a, const Job& b) { return a.entry.id < b.entry.id; });
  const std::vector<size_t> of_m = {0, 1, 2};  // b-1, b-2, b-3 (sorted); other-1 is got[3]
  const char* input0 = got[0].entry.inputs[0].data;
  const char* input2 = got[0].entry.inputs[2].data;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(input0) % alignof(std::max_align_t), 0u);
  EXPECT_EQ((input2 - input0) % 64, 0);
  for (size_t n = 0; n < of_m.size(); ++n) {
    const auto& in = got[of_m[n]].entry.inputs;
    const char tag = static_cast<char>('a' + (n == 0 ? 0 : n + 1));  // b-2 was put third
    EXPECT_EQ(in[0].data, input0 + 8 * n) << n;
    EXPECT_EQ(in[2].data, input2 + 8 * n) << n;
    EXPECT_EQ(std::string(in[0].data, 8), std::string(8, tag));
    EXPECT_EQ(std::string(in[1].data, 8), small_);  // carried in the CHUNK: left where it is
    EXPECT_EQ(std::string(in[2].data, 8), std::string(8, static_cast<char>(tag - 'a' + 'A')));
  }
  ASSERT_EQ(got[3].entry.id, "other-1");
  EXPECT_EQ(std::string(got[3].entry.inputs[0].data, 8), "bbbbbbbb");
  EXPECT_EQ(std::string(got[3].entry.inputs[2].data, 8), "BBBBBBBB");
}

// A stored input not in Redis, or of the wrong size, fails that job alone, with a code.
TEST_F(InputFetcherTest, MissingOrMisSizedInputsFailTheirJobOnly) {
  Put(keys_.Input("ok-1", 0), "abcdefgh");
  Put(keys_.Input("short-1", 0), "abc");
  Put(keys_.Input("long-1", 0), "abcdefghijkl");
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("gone-1", 1, {0}));
  jobs.push_back(MakeJob("short-1", 1, {0}));
  jobs.push_back(MakeJob("long-1", 1, {0}));
  jobs.push_back(MakeJob("ok-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::vector<Job> got;
  ASSERT_TRUE(queue_.TakeBatch(8, &got));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].entry.id, "ok-1");
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "abcdefgh");
  ASSERT_TRUE(testutil::WaitFor([&] {
    return Stored("gone-1").state != JobState::kPending &&
           Stored("short-1").state != JobState::kPending &&
           Stored("long-1").state != JobState::kPending;
  }));
  EXPECT_EQ(Stored("gone-1").error.code(), codes::kNotFound);
  EXPECT_EQ(Stored("short-1").error.code(), codes::kInvalidArgument);
  EXPECT_NE(Stored("short-1").error.message().find("has 3 bytes"), std::string::npos)
      << Stored("short-1").error.message();
  EXPECT_EQ(Stored("long-1").error.code(), codes::kInvalidArgument);
  EXPECT_NE(Stored("long-1").error.message().find("has 12 bytes"), std::string::npos)
      << Stored("long-1").error.message();
  // Their stored inputs go after the failed results, in the writer's next round (never beside
  // the result's SET: ResultWriter).
  EXPECT_TRUE(testutil::WaitFor([&] {
    std::string value;
    bool found = true;
    return client_->Get(keys_.Input("short-1", 0), &value, &found).ok() && !found;
  })) << "the input of a failed job was left in Redis";
}

// Redis down: the jobs wait (nothing queued, nothing failed) and go on once it is back.
TEST_F(InputFetcherTest, RedisDownTheJobsWaitAndGoOn) {
  Put(keys_.Input("w-1", 0), "waitwait");
  redis_.Stop();
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("w-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 1; }));
  EXPECT_EQ(queue_.size(), 0u);
  redis_.Restart();  // with its AOF: the input is there again
  std::vector<Job> got;
  ASSERT_TRUE(queue_.TakeBatch(8, &got));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "waitwait");
}

// The broker's CANCEL reaches jobs still in the fetcher: one waiting behind a read and one
// being read (here retried while Redis is down) both end `cancelled`, their stored inputs
// deleted with the result, and never reach the queue; the job beside them goes on.
TEST_F(InputFetcherTest, CancelledJobsInTheFetcherEndCancelledAndNeverReachTheQueue) {
  Put(keys_.Input("c-read", 0), "readread");
  Put(keys_.Input("c-wait", 0), "waitwait");
  Put(keys_.Input("keep-1", 0), "keepkeep");
  redis_.Stop();
  std::vector<Job> first;
  first.push_back(MakeJob("c-read", 1, {0}));
  fetcher_->Submit(std::move(first));
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 1; }));  // being read
  std::vector<Job> later;
  later.push_back(MakeJob("c-wait", 1, {0}));
  later.push_back(MakeJob("keep-1", 1, {0}));
  fetcher_->Submit(std::move(later));  // waiting behind it
  EXPECT_EQ(fetcher_->Cancel({"c-read", "c-wait", "not-here"}), 2u);
  redis_.Restart();  // with its AOF: the inputs are there again
  client_ = redis_.Connect();
  ASSERT_NE(client_, nullptr);
  std::vector<Job> got = Take(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].entry.id, "keep-1");
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "keepkeep");
  for (const char* id : {"c-read", "c-wait"}) {
    const Result r = Finished(id);
    EXPECT_EQ(r.error.code(), codes::kCancelled) << id << ": " << r.error.ToString();
    // Deleted in the writer's round after the result's (never beside its SET).
    EXPECT_TRUE(testutil::WaitFor([&] {
      bool found = true;
      std::string value;
      return client_->Get(keys_.Input(id, 0), &value, &found).ok() && !found;
    })) << id
        << "'s stored input outlived its result";
  }
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
  EXPECT_EQ(queue_.size(), 0u);
}

// The broker can send a job again to the worker that still holds it (it presumed the worker dead,
// or the worker reconnected, and requeued the job with attempt + 1; the id stays the same): the
// fetcher then holds two copies of one id. A CANCEL drops both -- here one being read and one
// waiting behind it -- and each copy is reported (DONE names the id twice), so that the worker
// accounts for every job it received.
TEST_F(InputFetcherTest, ACancelDropsACopyBeingReadAndACopyWaiting) {
  Put(keys_.Input("twice", 0), "twotwo!!");
  Put(keys_.Input("keep-2", 0), "keepkeep");
  redis_.Stop();
  std::vector<Job> first;
  first.push_back(MakeJob("twice", 1, {0}));
  fetcher_->Submit(std::move(first));
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->reading() == 1; }));
  std::vector<Job> again;
  again.push_back(MakeJob("twice", 1, {0}));
  again.back().entry.attempt = 2;
  again.push_back(MakeJob("keep-2", 1, {0}));
  fetcher_->Submit(std::move(again));  // waiting behind it
  EXPECT_EQ(fetcher_->Cancel({"twice"}), 2u);
  redis_.Restart();
  client_ = redis_.Connect();
  ASSERT_NE(client_, nullptr);
  std::vector<Job> got = Take(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].entry.id, "keep-2");
  EXPECT_EQ(Finished("twice").error.code(), codes::kCancelled);
  EXPECT_EQ(Reported("twice", 2), 2u);
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
  EXPECT_EQ(queue_.size(), 0u);
}

// Two copies of one id can also be read in the same turn (both waited behind a read that
// ended): a CANCEL then drops both, and counts both.
TEST_F(InputFetcherTest, ACancelDropsTwoCopiesBeingReadTogether) {
  Put(keys_.Input("twice", 0), "twotwo!!");
  redis_.Stop();
  std::vector<Job> first;
  first.push_back(MakeJob("ahead", 1, {0}));
  fetcher_->Submit(std::move(first));
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->reading() == 1; }));
  for (int64_t attempt : {1, 2}) {
    std::vector<Job> copy;
    copy.push_back(MakeJob("twice", 1, {0}));
    copy.back().entry.attempt = attempt;
    fetcher_->Submit(std::move(copy));
  }
  // "ahead" leaves its turn at its next retry; the two copies are then read together.
  EXPECT_EQ(fetcher_->Cancel({"ahead"}), 1u);
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->reading() == 2; }));
  EXPECT_EQ(fetcher_->Cancel({"twice"}), 2u);
  redis_.Restart();
  client_ = redis_.Connect();
  ASSERT_NE(client_, nullptr);
  EXPECT_EQ(Finished("twice").error.code(), codes::kCancelled);
  EXPECT_EQ(Finished("ahead").error.code(), codes::kCancelled);
  EXPECT_EQ(Reported("twice", 2), 2u);
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
  EXPECT_EQ(queue_.size(), 0u);
}

// A key Redis refuses to read (here WRONGTYPE: it holds a list) fails its job alone, with
// Redis's error; the jobs fetched with it and those after it go on (no retry: it would fail the
// same way every time, and every job behind it would wait).
TEST_F(InputFetcherTest, AKeyRedisRefusesToReadFailsItsJobOnly) {
  protocol::RedisReply r;
  ASSERT_TRUE(client_->Command({"RPUSH", keys_.Input("list-1", 0), "x"}, &r).ok());
  Put(keys_.Input("ok-1", 0), "abcdefgh");
  Put(keys_.Input("ok-2", 0), "ABCDEFGH");
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("list-1", 1, {0}));
  jobs.push_back(MakeJob("ok-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::vector<Job> later;
  later.push_back(MakeJob("ok-2", 1, {0}));
  fetcher_->Submit(std::move(later));
  std::vector<Job> got = Take(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].entry.id, "ok-1");
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "abcdefgh");
  EXPECT_EQ(got[1].entry.id, "ok-2");
  EXPECT_EQ(std::string(got[1].entry.inputs[0].data, 8), "ABCDEFGH");
  const Result failed = Finished("list-1");
  EXPECT_EQ(failed.error.code(), codes::kInvalidArgument);
  const std::string want =
      "stored input 0 (" + keys_.Input("list-1", 0) + ") cannot be read: WRONGTYPE";
  EXPECT_EQ(failed.error.message().rfind(want, 0), 0u) << failed.error.message();
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
}

// An error reply that goes away by itself (BUSY: a script runs) is retried with backoff, like
// Redis down: the job waits instead of failing, and goes on once Redis answers again.
TEST_F(InputFetcherTest, ATransientErrorReplyIsRetried) {
  Put(keys_.Input("busy-1", 0), "busybusy");
  protocol::RedisReply r;
  ASSERT_TRUE(client_->Command({"CONFIG", "SET", "lua-time-limit", "50"}, &r).ok());
  std::thread script([this] {
    auto busy = redis_.Connect();
    protocol::RedisReply reply;
    if (busy) busy->Command({"EVAL", "while true do end", "0"}, &reply);  // until SCRIPT KILL
  });
  ASSERT_TRUE(testutil::WaitFor([&] {
    protocol::RedisReply pong;
    return client_->Command({"PING"}, &pong).message().find("BUSY") != std::string::npos;
  }));
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("busy-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few tries
  EXPECT_EQ(fetcher_->pending(), 1u);
  EXPECT_EQ(queue_.size(), 0u);
  ASSERT_TRUE(client_->Command({"SCRIPT", "KILL"}, &r).ok());
  script.join();
  std::vector<Job> got = Take(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "busybusy");
  EXPECT_EQ(Stored("busy-1").state, JobState::kPending);  // not failed
}

// An input whose declared size cannot be held (1 PiB: no allocation can succeed) fails its job
// instead of ending the worker (here for its size: the value Redis holds is 8 bytes; a value
// of the declared size would fail it with internal, "no memory"); the job submitted with it is
// fetched in a turn of its own (a turn takes jobs up to kMaxTurnBytes of declared inputs) and
// goes on.
TEST_F(InputFetcherTest, AnInputTooBigToHoldFailsItsJobAndTheNextGoesOn) {
  Put(keys_.Input("huge-1", 0), "abcdefgh");
  Put(keys_.Input("ok-1", 0), "12345678");
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("huge-1", 1, {0}));
  protocol::TensorRef& t = jobs.back().entry.inputs[0];
  t.dtype = DType::kFloat32;
  t.shape = {int64_t{1} << 40, int64_t{1} << 8};
  t.size = size_t{1} << 50;
  jobs.push_back(MakeJob("ok-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::vector<Job> got = Take(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].entry.id, "ok-1");
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "12345678");
  const Result failed = Finished("huge-1");
  EXPECT_EQ(failed.error.code(), codes::kInvalidArgument);
  EXPECT_NE(failed.error.message().find("has 8 bytes"), std::string::npos)
      << failed.error.message();
  EXPECT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 0; }));
}

// A stored value longer than its input needs fails the job with its byte count, and is skipped
// on its way from the socket instead of being read into memory: the process's peak memory does
// not grow by the value's size.
TEST_F(InputFetcherTest, ALongValueFailsItsJobWithoutBeingHeldInMemory) {
  constexpr size_t kLong = size_t{128} << 20;
  protocol::RedisReply r;  // made by Redis itself: this process never holds it
  ASSERT_TRUE(
      client_->Command({"SETRANGE", keys_.Input("long-1", 0), std::to_string(kLong - 1), "x"}, &r)
          .ok());
  Put(keys_.Input("ok-1", 0), "abcdefgh");
  // The process's peak resident size: ctest runs each test in a process of its own
  // (gtest_discover_tests), so it is this test's. (Run after a test with a higher peak in one
  // process, this check cannot fail: run it alone.)
  auto peak_kib = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_maxrss);
  };
  const int64_t before = peak_kib();
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("long-1", 1, {0}));
  jobs.push_back(MakeJob("ok-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  std::vector<Job> got = Take(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::string(got[0].entry.inputs[0].data, 8), "abcdefgh");
  const Result failed = Finished("long-1");
  EXPECT_EQ(failed.error.code(), codes::kInvalidArgument);
  EXPECT_NE(failed.error.message().find("has " + std::to_string(kLong) + " bytes"),
            std::string::npos)
      << failed.error.message();
  EXPECT_LT(peak_kib() - before, int64_t{32} << 10) << "KiB more at the peak";
}

// Stop while Redis is down does not wait for it for good: the reads are retried until
// Options::stop_timeout_ms, then what is left is abandoned (logged) and the thread ends.
TEST_F(InputFetcherTest, StopGivesUpWhenRedisStaysDown) {
  redis_.Stop();
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("down-1", 1, {0}));
  fetcher_->Submit(std::move(jobs));
  ASSERT_TRUE(testutil::WaitFor([&] { return fetcher_->pending() == 1; }));
  auto stopped = std::async(std::launch::async, [this] { fetcher_->Stop(); });
  const bool finished = stopped.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!finished) redis_.Restart();  // lets the old Stop finish
  EXPECT_TRUE(finished) << "Stop waited for Redis";
  stopped.wait();
  EXPECT_EQ(queue_.size(), 0u);
  if (finished) redis_.Restart();  // for TearDown's writer
}

}  // namespace
}  // namespace ferry::worker
