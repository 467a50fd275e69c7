// protocol::PollSockets: zmq_poll's contract with fewer system calls, over real inproc sockets
// and an eventfd.

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "ferry/protocol/wire.h"
#include "process.h"

namespace ferry::protocol {
namespace {

// Whether thread `tid` of this process sleeps (state S in /proc: blocked, e.g. in poll).
bool Blocked(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t end = stat.rfind(')');  // the state follows "(comm)"
  return end != std::string::npos && end + 2 < stat.size() && stat[end + 2] == 'S';
}

pid_t ThisThread() { return static_cast<pid_t>(syscall(SYS_gettid)); }

class PollSocketsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_.bind("inproc://poll-test");
    b_.connect("inproc://poll-test");
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ASSERT_GE(wake_, 0);
  }
  void TearDown() override { close(wake_); }
  void Kick() {
    uint64_t one = 1;
    ASSERT_EQ(write(wake_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }
  zmq::context_t ctx_{1};
  zmq::socket_t a_{ctx_, zmq::socket_type::pair};
  zmq::socket_t b_{ctx_, zmq::socket_type::pair};
  int wake_ = -1;
};

TEST_F(PollSocketsTest, NothingReadyTimesOutWithZero) {
  zmq_pollitem_t items[] = {{a_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_, ZMQ_POLLIN, 0}};
  EXPECT_EQ(PollSockets(items, 2, 0), 0);
  EXPECT_EQ(PollSockets(items, 2, 20), 0);
  EXPECT_EQ(items[0].revents, 0);
  EXPECT_EQ(items[1].revents, 0);
}

TEST_F(PollSocketsTest, QueuedMessageIsReportedWithoutBlocking) {
  b_.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  zmq_pollitem_t items[] = {{a_.handle(), 0, ZMQ_POLLIN, 0}};
  // An hour's timeout: the call must return because the message is there.
  ASSERT_EQ(PollSockets(items, 1, 3600 * 1000), 1);
  EXPECT_EQ(items[0].revents, ZMQ_POLLIN);
  zmq::message_t m;
  ASSERT_TRUE(a_.recv(m, zmq::recv_flags::dontwait));
  EXPECT_EQ(m.to_string(), "hello");
}

TEST_F(PollSocketsTest, MessageArrivingWhileBlockedWakesIt) {
  const pid_t poller = ThisThread();
  std::thread sender([&] {
    EXPECT_TRUE(testutil::WaitFor([&] { return Blocked(poller); })) << "never blocked";
    b_.send(zmq::str_buffer("later"), zmq::send_flags::none);
  });
  zmq_pollitem_t items[] = {{a_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_, ZMQ_POLLIN, 0}};
  int ready = 0;
  // A notification without a message may end a call early (0): callers loop, as here.
  for (int i = 0; i < 100 && ready == 0; ++i) ready = PollSockets(items, 2, 60 * 1000);
  sender.join();
  ASSERT_EQ(ready, 1);
  EXPECT_EQ(items[0].revents, ZMQ_POLLIN);
  EXPECT_EQ(items[1].revents, 0);
}

TEST_F(PollSocketsTest, PlainDescriptorWakesABlockedCall) {
  const pid_t poller = ThisThread();
  std::thread kicker([&] {
    EXPECT_TRUE(testutil::WaitFor([&] { return Blocked(poller); })) << "never blocked";
    Kick();
  });
  zmq_pollitem_t items[] = {{a_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_, ZMQ_POLLIN, 0}};
  int ready = 0;
  for (int i = 0; i < 100 && ready == 0; ++i) ready = PollSockets(items, 2, 60 * 1000);
  kicker.join();
  ASSERT_EQ(ready, 1);
  EXPECT_EQ(items[0].revents, 0);
  EXPECT_EQ(items[1].revents, ZMQ_POLLIN);
}

TEST_F(PollSocketsTest, WritableSocketIsReportedForPollout) {
  zmq_pollitem_t items[] = {{b_.handle(), 0, ZMQ_POLLIN | ZMQ_POLLOUT, 0}};
  ASSERT_EQ(PollSockets(items, 1, 1000), 1);
  EXPECT_EQ(items[0].revents, ZMQ_POLLOUT);
}

TEST_F(PollSocketsTest, TooManyItemsIsAnError) {
  zmq_pollitem_t items[9] = {};
  EXPECT_EQ(PollSockets(items, 9, 0), -1);
  EXPECT_EQ(zmq_errno(), EINVAL);
}

}  // namespace
}  // namespace ferry::protocol
