// The SDK's FramePool (producer-sdk/src): an attached input's frame is a copy of its bytes in a
// buffer of the pool's, and once ZeroMQ has sent the frame (here: the message is closed, as
// libzmq does after sending) the buffer goes back and serves the next frame of a fitting size.
// Also over a real pair of TCP sockets, where libzmq's I/O thread gives it back.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "frame_pool.h"  // producer-sdk/src

namespace ferry::client {
namespace {

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

TEST(FramePoolTest, SentFramesBuffersServeTheNextFramesOfAFittingSize) {
  FramePool pool;
  const std::string a = Bytes(100000, 1);
  const void* first = nullptr;
  {
    zmq::message_t m = pool.Copy(a.data(), a.size());
    EXPECT_EQ(m.to_string(), a);
    first = m.data();
    EXPECT_EQ(pool.free_buffers(), 0u);
  }
  EXPECT_EQ(pool.free_buffers(), 1u);
  EXPECT_EQ(pool.free_bytes(), 100000u);
  // 80 KB fits the 100 KB buffer (at least half of it is used): reused, same memory.
  const std::string b = Bytes(80000, 2);
  zmq::message_t m2 = pool.Copy(b.data(), b.size());
  EXPECT_EQ(m2.data(), first);
  EXPECT_EQ(m2.to_string(), b);
  EXPECT_EQ(pool.free_buffers(), 0u);
  m2 = zmq::message_t();  // closed: its 100 KB buffer is back
  // 40 KB would waste more than half of it: a buffer of its own.
  zmq::message_t m3 = pool.Copy(b.data(), 40000);
  EXPECT_NE(m3.data(), first);
  EXPECT_EQ(pool.free_buffers(), 1u);
  // Bigger than any pooled buffer may be: never kept.
  {
    std::string huge(FramePool::kMaxPooledBytes + 1, 'x');
    zmq::message_t m4 = pool.Copy(huge.data(), huge.size());
    EXPECT_EQ(m4.size(), huge.size());
  }
  EXPECT_EQ(pool.free_buffers(), 1u);
  EXPECT_EQ(pool.Copy(a.data(), 0).size(), 0u);  // an empty frame takes no buffer
  EXPECT_EQ(pool.free_buffers(), 1u);
}

TEST(FramePoolTest, KeepsAtMostItsLimitAndFramesMayOutliveIt) {
  const std::string a = Bytes(1 << 20, 3);
  std::vector<zmq::message_t> frames;
  {
    FramePool pool;
    for (size_t i = 0; i < FramePool::kMaxFreeBuffers + 8; ++i)
      frames.push_back(pool.Copy(a.data(), a.size()));
    frames.resize(8);  // the others are given back; 64 MiB of 1 MiB buffers at most
    EXPECT_LE(pool.free_bytes(), FramePool::kMaxFreeBytes);
    EXPECT_EQ(pool.free_buffers(), FramePool::kMaxFreeBuffers);
  }
  for (const auto& f : frames) EXPECT_EQ(f.to_string(), a);  // the pool is gone; they are not
  frames.clear();
}

TEST(FramePoolTest, LibzmqGivesTheBufferBackAfterSending) {
  FramePool pool;
  zmq::context_t ctx(1);
  zmq::socket_t out(ctx, zmq::socket_type::pair), in(ctx, zmq::socket_type::pair);
  in.bind("tcp://127.0.0.1:*");
  out.connect(in.get(zmq::sockopt::last_endpoint));
  const std::string a = Bytes(300000, 4);
  zmq::message_t m = pool.Copy(a.data(), a.size());
  ASSERT_TRUE(out.send(m, zmq::send_flags::none));
  zmq::message_t got;
  ASSERT_TRUE(in.recv(got));
  EXPECT_EQ(got.to_string(), a);
  // Over TCP the receiver has its own copy; libzmq's I/O thread closed the sent one.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pool.free_buffers() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(pool.free_buffers(), 1u);
}

}  // namespace
}  // namespace ferry::client
