// The SDK's IoThread (producer-sdk/src) on its own, over real ZeroMQ sockets against a scripted
// frontend: it alone drives the socket -- notices reach the callback on the I/O thread while no
// caller waits, concurrent calls each get their own reply, a request forgotten before a broker
// came is never sent, each connection starts with LIMITS (sent again while unanswered) and a
// SUBMIT over them is refused here, an exception out of a callback is caught there, and an idle
// thread sleeps.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "io_thread.h"  // producer-sdk/src
#include "process.h"    // testutil: FreePort
#include "scripted_frontend.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
using client_test::ScriptedFrontend;
using std::chrono::milliseconds;

// Collects the ids of the FINISHED notices the I/O thread hands over, and on which thread.
class Notices {
 public:
  IoThread::FinishedFn Callback() {
    return [this](const std::vector<std::string>& ids, const protocol::InlineResults&) {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.insert(ids_.end(), ids.begin(), ids.end());
      thread_ = std::this_thread::get_id();
      cv_.notify_all();
    };
  }
  // The ids so far, once there are `n` (or after 30 s).
  std::vector<std::string> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return ids_.size() >= n; });
    return ids_;
  }
  std::thread::id thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return thread_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> ids_;
  std::thread::id thread_;
};

// Each test gets its own port (a scripted broker bound to it when the test starts one).
class IoThreadTest : public ::testing::Test {
 protected:
  void SetUp() override { port_ = testutil::FreePort(); }
  void Start(IoThread::FinishedFn on_finished, std::unique_ptr<IoThread>* io) {
    IoThread::Options o;
    o.frontend = "tcp://127.0.0.1:" + std::to_string(port_);
    o.on_finished = std::move(on_finished);
    ASSERT_TRUE(IoThread::Start(std::move(o), io).ok());
  }
  int port_ = 0;
};

zmq::message_t EmptySubmit(int64_t rid) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(2);
  protocol::PackString(pk, "jobs");
  pk.pack_array(0);
  protocol::PackString(pk, "rid");
  pk.pack_int64(rid);
  return protocol::ToMessage(std::move(buf));
}

// A SUBMIT of no jobs, so that the scripted broker knows where to send FINISHED.
void SubmitNothing(IoThread* io) {
  IoThread::Reply reply;
  const int64_t rid = io->NextRid();
  Status s = io->Call(rid, protocol::kSubmit, EmptySubmit(rid), 5000, &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kAccepted);
}

Status Stats(IoThread* io, IoThread::Reply* reply) {
  const int64_t rid = io->NextRid();
  return io->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 5000, reply);
}

TEST_F(IoThreadTest, NoticesReachTheCallbackOnTheIoThreadWhileNoCallerWaits) {
  ScriptedFrontend broker(port_);
  Notices notices;
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(notices.Callback(), &io));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(io.get()));
  broker.Finish({"bg-1", "bg-2"});
  EXPECT_EQ(notices.WaitFor(2), (std::vector<std::string>{"bg-1", "bg-2"}));
  EXPECT_NE(notices.thread(), std::this_thread::get_id());
  EXPECT_NE(notices.thread(), std::thread::id());
}

// Many threads call at once through the one socket: every reply goes to the call whose rid it
// carries.
TEST_F(IoThreadTest, ConcurrentCallsEachGetTheirOwnReply) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  constexpr int kThreads = 8, kCallsEach = 50;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < kCallsEach; ++k) {
        IoThread::Reply reply;
        const int64_t rid = io->NextRid();
        if (!io->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid), 5000, &reply).ok())
          continue;
        msgpack::object_handle oh;
        int64_t echoed = 0;
        if (protocol::UnpackMap(reply.body.data(), reply.body.size(), &oh).ok() &&
            protocol::GetInt(oh.get(), "rid", &echoed, 0).ok() && echoed == rid)
          ++good;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), kThreads * kCallsEach);
}

// No broker: the request waits unsent; its caller gives up (Forget says it was never sent), and a
// broker that comes up later never sees it -- only the next request.
TEST_F(IoThreadTest, ARequestForgottenBeforeABrokerCameIsNeverSent) {
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  const int64_t rid = io->NextRid();
  const int64_t turns = io->loop_turns();
  auto request = io->Post(rid, protocol::kSubmit, EmptySubmit(rid), nullptr);
  // The thread has taken it (a turn after the post), and had nothing to send it to.
  ASSERT_TRUE(testutil::WaitFor([&] { return io->loop_turns() > turns + 1; }));
  EXPECT_TRUE(io->Forget(request)) << "sent without a broker";

  ScriptedFrontend broker(port_);
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(io.get()));
  EXPECT_EQ(broker.submits(), 1) << "the forgotten SUBMIT reached the broker that came later";
}

// Forget on a request that went out says so (false): the caller then knows the broker may
// have it.
TEST_F(IoThreadTest, ForgetSaysARequestWentOut) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  std::atomic<int> replies{0};
  const int64_t rid = io->NextRid();
  auto request =
      io->Post(rid, protocol::kSubmit, EmptySubmit(rid), [&](IoThread::Reply) { ++replies; });
  ASSERT_TRUE(testutil::WaitFor([&] { return replies.load() == 1; }));
  EXPECT_EQ(broker.submits(), 1);
  EXPECT_FALSE(io->Forget(request));
}

// A SUBMIT of an empty job list with `bytes` of data frames after its body (frames the broker
// counts against --max-message-bytes).
Status SubmitWithFrames(IoThread* io, size_t bytes, IoThread::Reply* reply) {
  const int64_t rid = io->NextRid();
  std::vector<zmq::message_t> frames;
  frames.emplace_back(bytes);
  return io->Call(rid, protocol::kSubmit, EmptySubmit(rid), 5000, reply, std::move(frames));
}

// The first request on each connection is LIMITS, and nothing else goes out before its answer.
// A SUBMIT over the limit it gives is answered here (ERROR too_large), never sent: the broker's
// libzmq would drop the connection unanswered. A broker restarted with a lower limit is asked
// again on the new connection: what the last one took, it refuses.
TEST_F(IoThreadTest, EachConnectionStartsWithLimitsAndASubmitOverThemIsNotSent) {
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  IoThread::Reply reply;
  {
    ScriptedFrontend broker(port_);
    broker.set_max_message_bytes(1 << 20);
    Status s = SubmitWithFrames(io.get(), 8192, &reply);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(reply.command, protocol::kAccepted);
    EXPECT_EQ(broker.commands(), (std::vector<std::string>{"LIMITS", "SUBMIT"}));
    EXPECT_EQ(io->broker_max_message_bytes(), 1 << 20);
  }
  ScriptedFrontend restarted(port_);
  restarted.set_max_message_bytes(4096);
  Status s = SubmitWithFrames(io.get(), 8192, &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(reply.command, protocol::kError);
  msgpack::object_handle body;
  ASSERT_TRUE(protocol::UnpackMap(reply.body.data(), reply.body.size(), &body).ok());
  Status error;
  ASSERT_TRUE(protocol::DecodeError(body.get(), &error).ok());
  EXPECT_EQ(error.code(), codes::kTooLarge) << error.ToString();
  EXPECT_NE(error.message().find("4096"), std::string::npos) << error.ToString();
  EXPECT_EQ(io->broker_max_message_bytes(), 4096);
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(io.get()));  // the connection is still there
  EXPECT_EQ(restarted.commands(), (std::vector<std::string>{"LIMITS", "SUBMIT"}));
  EXPECT_EQ(restarted.submits(), 1);
}

// A broker that does not know LIMITS (ERROR unknown_command; here ERROR to everything) leaves
// the client's configured limit, and requests go out as before.
TEST_F(IoThreadTest, ABrokerWithoutLimitsLeavesTheConfiguredLimit) {
  ScriptedFrontend broker(port_);
  broker.set_error_reply(true);
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  IoThread::Reply reply;
  ASSERT_TRUE(Stats(io.get(), &reply).ok());
  EXPECT_EQ(reply.command, protocol::kError);
  EXPECT_EQ(io->broker_max_message_bytes(), IoThread::Options().max_message_bytes);
  EXPECT_EQ(broker.commands(), (std::vector<std::string>{"LIMITS", "STATS"}));
}

// A LIMITS lost on the way (libzmq takes one sent just as the connection drops into the dead
// connection's pipe) is sent again, with its rid: the requests behind it go out, not wait for
// ever.
TEST_F(IoThreadTest, AnUnansweredLimitsIsSentAgain) {
  ScriptedFrontend broker(port_);
  broker.set_lose_limits(1);
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  IoThread::Reply reply;
  Status s = Stats(io.get(), &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kStats);
  EXPECT_EQ(broker.commands(), (std::vector<std::string>{"LIMITS", "LIMITS", "STATS"}));
  const std::vector<int64_t> rids = broker.limits_rids();
  ASSERT_EQ(rids.size(), 2u);
  EXPECT_EQ(rids[0], rids[1]) << "a resend keeps its rid: either answer is taken";
}

// An exception out of the FINISHED callback (here std::bad_alloc) is caught on the I/O thread:
// the process goes on, the notice that threw is dropped, later notices and calls still work.
TEST_F(IoThreadTest, AnExceptionFromACallbackIsCaughtAndCounted) {
  ScriptedFrontend broker(port_);
  Notices notices;
  auto collect = notices.Callback();
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(
      [&](const std::vector<std::string>& ids, const protocol::InlineResults& records) {
        if (ids.size() == 1 && ids[0] == "throws") throw std::bad_alloc();
        collect(ids, records);
      },
      &io));
  ASSERT_NO_FATAL_FAILURE(SubmitNothing(io.get()));
  broker.Finish({"throws"});
  ASSERT_TRUE(testutil::WaitFor([&] { return io->callback_errors() == 1; }));
  broker.Finish({"after-1", "after-2"});
  EXPECT_EQ(notices.WaitFor(2), (std::vector<std::string>{"after-1", "after-2"}));
  IoThread::Reply reply;
  Status s = Stats(io.get(), &reply);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reply.command, protocol::kStats);
  EXPECT_EQ(io->callback_errors(), 1);
}

// With nothing to do the thread sleeps in poll: no timer turns its loop while no request is
// outstanding.
TEST_F(IoThreadTest, AnIdleThreadSleeps) {
  ScriptedFrontend broker(port_);
  std::unique_ptr<IoThread> io;
  ASSERT_NO_FATAL_FAILURE(Start(nullptr, &io));
  IoThread::Reply reply;
  ASSERT_TRUE(Stats(io.get(), &reply).ok());
  const int64_t before = io->loop_turns();
  std::this_thread::sleep_for(milliseconds(1000));
  EXPECT_LE(io->loop_turns() - before, 2) << "the I/O thread woke while idle";
}

}  // namespace
}  // namespace ferry::client
