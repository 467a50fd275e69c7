// The SDK's FrontendConnection (producer-sdk/src) on its own, over real ZeroMQ sockets against a
// scripted frontend: its leader/follower driving -- the background thread reads while no caller
// waits, a driving caller serves another caller's request, the background thread hands the socket
// over once per idle caller and sleeps while a caller drives, and Signal ends both kinds of wait.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "redis_fixture.h"  // FreePort
#include "scripted_frontend.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "frontend_connection.h"  // producer-sdk/src

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using client_test::ScriptedFrontend;

// Each test gets its own port (a scripted broker bound to it).
class FrontendConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = client_test::FreePort();
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(port_);
  }
  // A connection to this test's port, started with `on_finished` (null: notices are dropped).
  void Connect(FrontendConnection::FinishedFn on_finished,
               std::unique_ptr<FrontendConnection>* conn) {
    ASSERT_TRUE(FrontendConnection::Create(endpoint_, conn).ok());
    ASSERT_TRUE((*conn)->Start(std::move(on_finished)).ok());
  }
  int port_ = 0;
  std::string endpoint_;
};

// Collects the ids of the FINISHED notices a connection hands over (on whichever thread drives).
class Notices {
 public:
  FrontendConnection::FinishedFn Callback() {
    return [this](const std::vector<std::string>& ids, const protocol::InlineResults&) {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.insert(ids_.end(), ids.begin(), ids.end());
      cv_.notify_all();
    };
  }
  // The ids so far, once there are `n` (or after 30 s).
  std::vector<std::string> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return ids_.size() >= n; });
    return ids_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> ids_;
};

// A SUBMIT of no jobs, so that the scripted broker knows where to send FINISHED.
void SubmitNothing(FrontendConnection* conn) {
  FrontendConnection::Reply reply;
  const int64_t rid = conn->NextRid();
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(2);
  protocol::PackString(pk, "jobs");
  pk.pack_array(0);
  protocol::PackString(pk, "rid");
  pk.pack_int64(rid);
  ASSERT_TRUE(conn->Call(rid, protocol::kSubmit, protocol::ToMessage(std::move(buf)), 5000,
                         &reply).ok());
  EXPECT_EQ(reply.command, protocol::kAccepted);
}

// Nobody waits: the background thread still reads the socket and hands FINISHED notices over.
TEST_F(FrontendConnectionTest, BackgroundThreadReadsWhileNoCallerWaits) {
  ScriptedFrontend broker(port_);
  Notices notices;
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(notices.Callback(), &conn));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(conn.get()));
  broker.Finish({"bg-1", "bg-2"});
  // This thread only sleeps on its own condition variable: no Call, no Await.
  EXPECT_EQ(notices.WaitFor(2), (std::vector<std::string>{"bg-1", "bg-2"}))
      << "FINISHED was not read while no caller waited";
}

// A caller that drives the socket for its own long wait also sends another caller's request and
// hands it the reply: the second call completes while the first is still waiting.
TEST_F(FrontendConnectionTest, DrivingCallerServesAnotherCallersRequest) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(nullptr, &conn));
  std::atomic<bool> first_returned{false};
  Waiter never_signaled;
  std::thread first([&] {
    // Takes the socket (the background thread yields) and keeps it for 3 s.
    EXPECT_FALSE(conn->Await(&never_signaled, Clock::now() + std::chrono::seconds(3)));
    first_returned = true;
  });
  std::this_thread::sleep_for(milliseconds(100));  // let it take the socket (not required)
  FrontendConnection::Reply reply;
  const int64_t rid = conn->NextRid();
  Status s = conn->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 20000, &reply);
  const bool first_still_waiting = !first_returned;
  first.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kStats);
  EXPECT_TRUE(first_still_waiting) << "the reply waited for the driving caller to leave";
}

// A caller that finds the background thread driving takes the socket with one hand-over: the
// background thread does not take it back at once (the two would pass it to and fro). Calls are
// spaced beyond kIdleHandback, so the background thread drives between them.
TEST_F(FrontendConnectionTest, BackgroundThreadYieldsOncePerIdleCaller) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(nullptr, &conn));
  constexpr int kCalls = 20;
  for (int i = 0; i < kCalls; ++i) {
    std::this_thread::sleep_for(FrontendConnection::kIdleHandback * 3);
    FrontendConnection::Reply reply;
    const int64_t rid = conn->NextRid();
    ASSERT_TRUE(
        conn->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 20000, &reply).ok());
  }
  // One hand-over per call; a second one only when this thread slept through the whole idle
  // period between being woken and taking the socket.
  EXPECT_GE(conn->background_yields(), 1);
  EXPECT_LE(conn->background_yields(), 2 * kCalls);
}

// While one caller drives the socket for long (a long wait for a result), the background thread
// sleeps instead of checking every kIdleHandback (200 times a second), and it still takes the
// socket back once the caller leaves: a FINISHED that comes afterwards is read with no caller
// waiting.
TEST_F(FrontendConnectionTest, BackgroundThreadSleepsWhileACallerDrives) {
  ScriptedFrontend broker(port_);
  Notices notices;
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(notices.Callback(), &conn));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(conn.get()));
  constexpr auto kDrive = milliseconds(1000);
  const int64_t before = conn->background_turns();
  Waiter never_signaled;
  EXPECT_FALSE(conn->Await(&never_signaled, Clock::now() + kDrive));
  const int64_t turns = conn->background_turns() - before;
  EXPECT_LE(turns, 10) << "the background thread woke " << turns << " times in "
                       << kDrive.count() << " ms while a caller drove";
  broker.Finish({"after-1"});
  EXPECT_EQ(notices.WaitFor(1), std::vector<std::string>{"after-1"})
      << "the background thread did not take the socket back";
}

// Two callers end their waits together after the background thread has gone to sleep: A drives
// until its deadline, B sleeps; when A leaves it offers the socket to B, and A's thread signals B
// at once, so B usually leaves before it takes the socket (otherwise it drives and leaves).
// Either way the background thread must be woken to take the socket back.
TEST_F(FrontendConnectionTest, CallersLeavingTogetherHandTheSocketBack) {
  ScriptedFrontend broker(port_);
  Notices notices;
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(notices.Callback(), &conn));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(conn.get()));
  for (int round = 0; round < 5; ++round) {
    Waiter a, b;
    std::thread tb([&] { EXPECT_TRUE(conn->Await(&b, Clock::now() + std::chrono::seconds(60))); });
    std::thread ta([&] {
      EXPECT_FALSE(conn->Await(&a, Clock::now() + milliseconds(200)));
      conn->Signal(&b);
    });
    ta.join();
    tb.join();
    const std::string id = "after-" + std::to_string(round);
    broker.Finish({id});
    const std::vector<std::string> got = notices.WaitFor(static_cast<size_t>(round) + 1);
    ASSERT_EQ(got.size(), static_cast<size_t>(round) + 1)
        << "round " << round << ": the socket was left with nobody reading it";
    EXPECT_EQ(got.back(), id);
  }
}

// An exception out of the FINISHED callback reaches the caller that was driving, and the socket
// is not left marked as driven: the next call still gets its reply.
TEST_F(FrontendConnectionTest, AnExceptionWhileDrivingLeavesTheSocketToOthers) {
  ScriptedFrontend broker(port_);
  const std::thread::id test_thread = std::this_thread::get_id();
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(
      [&](const std::vector<std::string>&, const protocol::InlineResults&) {
        // Only on this thread (on the background thread it is caught: the next test).
        if (std::this_thread::get_id() == test_thread) throw std::runtime_error("callback failed");
      },
      &conn));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(conn.get()));
  bool thrown = false;
  // The test thread normally drives when FINISHED comes; should the background thread read it
  // first (a slow scheduler), try again.
  for (int round = 0; round < 20 && !thrown; ++round) {
    broker.Finish({"x-" + std::to_string(round)});
    Waiter w;
    try {
      conn->Await(&w, Clock::now() + milliseconds(500));
    } catch (const std::runtime_error&) {
      thrown = true;
    }
  }
  ASSERT_TRUE(thrown) << "the callback never ran on the driving caller";
  FrontendConnection::Reply reply;
  const int64_t rid = conn->NextRid();
  Status s = conn->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 5000, &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kStats);
}

// The same exception on the background thread (nobody waits, so it reads the FINISHED) is caught
// there: the process goes on, the notice that threw is dropped, and the next ones still arrive.
TEST_F(FrontendConnectionTest, AnExceptionOnTheBackgroundThreadIsCaughtAndCounted) {
  ScriptedFrontend broker(port_);
  Notices notices;
  auto collect = notices.Callback();
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(
      [&](const std::vector<std::string>& ids, const protocol::InlineResults& records) {
        if (ids.size() == 1 && ids[0] == "throws") throw std::bad_alloc();
        collect(ids, records);
      },
      &conn));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(conn.get()));
  broker.Finish({"throws"});
  // This thread neither calls nor waits on the connection until the error is counted.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (conn->background_errors() == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(conn->background_errors(), 1);
  broker.Finish({"after-1", "after-2"});
  EXPECT_EQ(notices.WaitFor(2), (std::vector<std::string>{"after-1", "after-2"}));
  FrontendConnection::Reply reply;
  const int64_t rid = conn->NextRid();
  Status s = conn->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 5000, &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kStats);
}

// Signal from another thread ends a wait, whether the waiter drives the socket or sleeps.
TEST_F(FrontendConnectionTest, SignalFromAnotherThreadEndsAwait) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<FrontendConnection> conn;
  ASSERT_NO_FATAL_FAILURE(Connect(nullptr, &conn));
  Waiter a, b;
  std::atomic<int> ended{0};
  auto wait = [&](Waiter* w) {
    if (conn->Await(w, Clock::now() + std::chrono::seconds(60))) ++ended;
  };
  std::thread ta(wait, &a), tb(wait, &b);  // one drives, the other sleeps
  std::this_thread::sleep_for(milliseconds(100));
  conn->Signal(&a);
  conn->Signal(&b);
  ta.join();
  tb.join();
  EXPECT_EQ(ended.load(), 2);
  EXPECT_TRUE(a.signaled && b.signaled);
}

}  // namespace
}  // namespace ferry::client
