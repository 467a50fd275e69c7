// The SDK's ResultTracker (producer-sdk/src) on its own, reading from a real redis-server through
// the SDK's RedisStore: a Wait that ends by an exception leaves nothing behind (the regression
// test for the use-after-scope of the leader/follower SDK, whose Wait left its stack Waiter
// registered when the socket's callback threw, so the next notice signaled a dead object), a
// record is delivered once, ids of ours skip the first read, RecheckOurs makes waits read, and a
// notice after one that came before its record makes them read again.

#include "result_tracker.h"  // producer-sdk/src

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "ferry/protocol/keys.h"
#include "process.h"  // testutil: RedisServer
#include "redis_store.h"
#include "result_deleter.h"
#include "submit_fixture.h"  // DoneRecord, CommandCalls, WriteDone

namespace ferry::client {
namespace {

using client_test::CommandCalls;
using client_test::DoneRecord;
using client_test::WriteDone;

class ResultTrackerTest : public ::testing::Test {
 protected:
  ResultTrackerTest()
      : store_(redis_.endpoint(), "test:", 2000),
        tracker_([this](const std::string& id, int timeout_ms, Result* out) {
          ++reads_;
          read_timeout_ms_ = timeout_ms;
          if (throw_on_read_) throw std::runtime_error("read failed");
          return store_.Read(id, out);
        }) {}

  testutil::RedisServer redis_;
  RedisStore store_;
  std::atomic<bool> throw_on_read_{false};
  std::atomic<int> reads_{0};
  std::atomic<int> read_timeout_ms_{0};  // the last read's bound
  ResultTracker tracker_;
};

// The regression test: an exception thrown inside Wait (here out of its Redis read, as the old
// SDK's socket callback did) ends that Wait with no waiter left registered on the id; a notice
// afterwards touches nothing of it (under AddressSanitizer, the old code's signal to the dead
// waiter is a stack-use-after-scope), and the next Wait gets the notice's record.
TEST_F(ResultTrackerTest, AWaitThatEndsByAnExceptionLeavesNothingBehind) {
  tracker_.Track({"j-1"});
  tracker_.RecheckOurs();  // so the Wait reads at once
  throw_on_read_ = true;
  Result r;
  EXPECT_THROW(tracker_.Wait("j-1", 1000, &r), std::runtime_error);
  EXPECT_EQ(tracker_.Waiters("j-1"), 0) << "the ended Wait is still registered";
  throw_on_read_ = false;
  const std::string record = DoneRecord("j-1", 7);
  tracker_.Notify({"j-1"}, {{"j-1", record}});
  const int reads = reads_;
  ASSERT_TRUE(tracker_.Wait("j-1", 1000, &r).ok());
  EXPECT_EQ(r.batch_size, 7);
  EXPECT_EQ(reads_, reads) << "the inline record needed no read";
  EXPECT_EQ(tracker_.Entries(), 0u) << "a delivered result leaves its entry";
}

// A notice that came before anyone waited is kept for the Wait, and delivered once: a later
// Wait on the id reads Redis.
TEST_F(ResultTrackerTest, ARecordIsDeliveredOnceThenRedisIsRead) {
  tracker_.Track({"d-1"});
  tracker_.Notify({"d-1"}, {{"d-1", DoneRecord("d-1", 3)}});
  Result r;
  ASSERT_TRUE(tracker_.Wait("d-1", 1000, &r).ok());
  EXPECT_EQ(r.batch_size, 3);
  EXPECT_EQ(reads_, 0);
  WriteDone(redis_, "d-1", 4);
  ASSERT_TRUE(tracker_.Wait("d-1", 1000, &r).ok());
  EXPECT_EQ(r.batch_size, 4);
  EXPECT_EQ(reads_, 1);
}

// Under consume_results a record one Wait read is deleted right after: the others waiting on
// the id at that moment get the result from that Wait, instead of waiting for a record that is
// gone until their timeout.
TEST_F(ResultTrackerTest, WaitsOnOneIdShareTheResultOneOfThemReadAndDeleted) {
  ResultTracker* self = nullptr;
  std::atomic<int> reads{0};
  std::atomic<bool> first_read{false};
  ResultTracker consuming([&](const std::string& id, int, Result* out) {
    if (reads++ > 0) {  // a later read: after the first one took the record
      EXPECT_TRUE(testutil::WaitFor([&] { return first_read.load(); }));
      return store_.Read(id, out);
    }
    EXPECT_TRUE(testutil::WaitFor([&] { return self->Waiters(id) == 2; }));  // both wait
    Status s = store_.Read(id, out, /*consume=*/true);
    first_read = true;
    return s;
  });
  self = &consuming;
  WriteDone(redis_, "shared", 5);
  Result a, b;
  Status sa, sb;
  std::thread other([&] { sb = consuming.Wait("shared", 3000, &b); });
  sa = consuming.Wait("shared", 3000, &a);
  other.join();
  ASSERT_TRUE(sa.ok()) << sa.ToString();
  ASSERT_TRUE(sb.ok()) << sb.ToString();
  EXPECT_EQ(a.batch_size, 5);
  EXPECT_EQ(b.batch_size, 5);
  EXPECT_EQ(consuming.Entries(), 0u);
}

// An id of ours with no notice yet: Wait does not read at once (the notice will say when); a
// notice without a record makes it read exactly once. An id not ours is read at once.
TEST_F(ResultTrackerTest, OursWaitsForTheNoticeOthersReadAtOnce) {
  tracker_.Track({"o-1"});
  WriteDone(redis_, "o-1", 5);
  Result r;
  std::thread notifier([&] {  // once the Wait sleeps: it did not read at once
    ASSERT_TRUE(testutil::WaitFor([&] { return tracker_.Waiters("o-1") == 1; }));
    EXPECT_EQ(reads_, 0);
    tracker_.Notify({"o-1"});
  });
  ASSERT_TRUE(tracker_.Wait("o-1", 10000, &r).ok());
  notifier.join();
  EXPECT_EQ(r.batch_size, 5);
  EXPECT_EQ(reads_, 1);

  WriteDone(redis_, "other-1", 6);
  ASSERT_TRUE(tracker_.Wait("other-1", 0, &r).ok());  // one check
  EXPECT_EQ(r.batch_size, 6);
  EXPECT_EQ(reads_, 2);
}

// A Wait on an id of ours shorter than the first re-check (50 ms) still reads Redis once,
// halfway, with the other half for the read, instead of timing out unread: its notice may have
// been lost (a broker that restarted sent FINISHED on a dead connection), and a caller polling
// with short waits would otherwise never see the result.
TEST_F(ResultTrackerTest, AShortWaitOnAnIdOfOursReadsOnceBeforeItTimesOut) {
  tracker_.Track({"s-1"});
  Result r;
  EXPECT_EQ(tracker_.Wait("s-1", 40, &r).code(), codes::kTimeout);
  EXPECT_EQ(reads_, 1);
  // ~20 ms; at the deadline it was 1 ms, too little for a Redis on another host to answer.
  EXPECT_GT(read_timeout_ms_, 1);
  WriteDone(redis_, "s-1", 4);
  ASSERT_TRUE(tracker_.Wait("s-1", 40, &r).ok());
  EXPECT_EQ(r.batch_size, 4);
}

// A lost subscription: RecheckOurs makes every Wait on an id of ours read now, not at its next
// backed-off re-check.
TEST_F(ResultTrackerTest, RecheckOursWakesWaitsToRead) {
  tracker_.Track({"r-1"});
  Result r;
  Status s;
  std::thread waiter([&] { s = tracker_.Wait("r-1", 60000, &r); });
  ASSERT_TRUE(testutil::WaitFor([&] { return tracker_.Waiters("r-1") == 1; }));
  WriteDone(redis_, "r-1", 9);
  const int reads = reads_;
  tracker_.RecheckOurs();
  waiter.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.batch_size, 9);
  EXPECT_EQ(reads_, reads + 1);
}

// A worker whose write Redis refused at first publishes its notice before the record is stored
// (docs/protocol.md, notices): the Wait reads nothing. The notice that follows once the record
// is there (the broker's FINISHED) makes it read again at once, or hands it the record inline.
// Re-checks are set to ten minutes and Waits to 20 s, so only that second notice can end them.
TEST_F(ResultTrackerTest, ANoticeAfterAnEarlyOneMakesTheWaitReadAgain) {
  std::atomic<int> reads{0};
  ResultTracker tracker(
      [&](const std::string& id, int, Result* out) {
        const Status s = store_.Read(id, out);
        ++reads;  // once it returned: what it found was there before the count moved
        return s;
      },
      nullptr, RecheckTimes{std::chrono::minutes(10), std::chrono::minutes(10)});
  auto early_notice = [&](const std::string& id, Result* r, Status* s) {
    tracker.Track({id});
    const int before = reads;
    std::thread waiter([&tracker, id, r, s] { *s = tracker.Wait(id, 20000, r); });
    EXPECT_TRUE(testutil::WaitFor([&] { return tracker.Waiters(id) == 1; }));
    tracker.Notify({id});  // no record in Redis yet
    EXPECT_TRUE(testutil::WaitFor([&] { return reads == before + 1; })) << "no read after it";
    EXPECT_EQ(tracker.Waiters(id), 1) << "the Wait ended on a record that is not there";
    return waiter;
  };

  Result r;
  Status s;
  std::thread waiter = early_notice("late-1", &r, &s);
  WriteDone(redis_, "late-1", 4);
  tracker.Notify({"late-1"});  // FINISHED, once it is stored
  waiter.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.batch_size, 4);
  EXPECT_EQ(reads, 2);

  waiter = early_notice("late-2", &r, &s);
  tracker.Notify({"late-2"}, {{"late-2", DoneRecord("late-2", 6)}});  // with the record inline
  waiter.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.batch_size, 6);
  EXPECT_EQ(reads, 3) << "the inline record needed no read";
}

// A rejection ends only the Wait given that verdict; another Wait on the same id goes on.
TEST_F(ResultTrackerTest, RejectEndsOnlyTheWaitWithThatVerdict) {
  tracker_.Track({"v-1"});
  ResultTracker::Verdict verdict;
  Result r1, r2;
  Status s1, s2;
  std::thread w1([&] { s1 = tracker_.Wait("v-1", 60000, &r1, &verdict); });
  std::thread w2([&] { s2 = tracker_.Wait("v-1", 60000, &r2); });
  ASSERT_TRUE(testutil::WaitFor([&] { return tracker_.Waiters("v-1") == 2; }));
  tracker_.Reject("v-1", &verdict, Status(codes::kQueueFull, "full"));
  w1.join();
  EXPECT_EQ(s1.code(), codes::kQueueFull);
  EXPECT_EQ(tracker_.Waiters("v-1"), 1);
  tracker_.Notify({"v-1"}, {{"v-1", DoneRecord("v-1", 2)}});
  w2.join();
  ASSERT_TRUE(s2.ok()) << s2.ToString();
  EXPECT_EQ(r2.batch_size, 2);
}

// Inline records kept for nobody are capped: past kMaxHeldBytes a notice keeps only "has a
// result", and that id's Wait reads Redis.
TEST_F(ResultTrackerTest, RecordsKeptForNobodyAreCapped) {
  const std::string big(1 << 20, 'x');  // not a valid record: never decoded here
  const size_t fit = ResultTracker::kMaxHeldBytes / big.size();
  std::vector<std::string> ids;
  for (size_t i = 0; i <= fit; ++i) ids.push_back("c-" + std::to_string(i));
  tracker_.Track(ids);
  for (size_t i = 0; i < fit; ++i) tracker_.Notify({ids[i]}, {{ids[i], big}});
  const std::string& last = ids.back();
  tracker_.Notify({last}, {{last, DoneRecord(last, 1)}});  // over the cap: not kept
  WriteDone(redis_, last, 8);
  Result r;
  ASSERT_TRUE(tracker_.Wait(last, 1000, &r).ok());
  EXPECT_EQ(r.batch_size, 8) << "came from Redis, not from the dropped record";
}

// The ResultDeleter (consume_results: results that came inline are deleted in the background)
// with Redis unreachable -- stopped by SIGSTOP, so that connections hang instead of being
// refused -- and 5,000 deletions queued: its destructor lets the round trip in progress fail
// and makes no other, instead of one round trip (one request timeout) per 1,000 ids. Counted
// by what Redis runs once it goes on: the DEL of that one round trip (1,000 ids) at most.
TEST(ResultDeleterTest, ItsDestructorGivesUpAfterAFailedRoundTrip) {
  testutil::RedisServer redis;
  RedisStore store(redis.endpoint(), "test:", 1000);
  {
    ResultDeleter deleter(&store);
    redis.Signal(SIGSTOP);
    for (int i = 0; i < 5000; ++i) deleter.Add("r" + std::to_string(i));
  }
  redis.Signal(SIGCONT);
  EXPECT_TRUE(testutil::WaitFor([&] { return CommandCalls(redis, "del") > 0; }));
  EXPECT_EQ(CommandCalls(redis, "del"), 1);
}

// An ACL user that may GETDEL results but not DEL them (the producer user of before): the
// deletions fall back to GETDEL, and the results are gone all the same.
TEST(RedisStoreTest, DeleteResultsFallsBackToGetdelForAUserThatMayNotDel) {
  testutil::RedisServer redis;
  WriteDone(redis, "d-1", 1);
  WriteDone(redis, "d-2", 2);
  auto admin = redis.Connect();
  ASSERT_NE(admin, nullptr);
  protocol::RedisReply r;
  ASSERT_TRUE(admin->Command({"ACL", "SETUSER", "default", "-del"}, &r).ok());
  RedisStore store(redis.endpoint(), "test:", 2000);
  ASSERT_TRUE(store.DeleteResults({"d-1"}).ok());
  ASSERT_TRUE(store.DeleteResults({"d-2"}).ok());
  ASSERT_TRUE(admin->Command({"EXISTS", "test:result:d-1", "test:result:d-2"}, &r).ok());
  EXPECT_EQ(r.integer, 0) << "results left";
  EXPECT_EQ(CommandCalls(redis, "getdel"), 2);
  EXPECT_EQ(CommandCalls(redis, "del"), 0) << "DEL was tried again after its NOPERM";
}

}  // namespace
}  // namespace ferry::client
