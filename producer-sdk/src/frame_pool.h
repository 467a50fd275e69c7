#pragma once
// FramePool: buffers for the data frames of attached inputs (docs/protocol.md), reused.
//
// The client copies each attached input once, into a ZeroMQ message that the I/O thread sends
// and libzmq frees on its own thread once the bytes are out. With glibc's default allocator a
// fresh buffer of ~1 MB per frame is a fresh mapping, faulted in page by page on every copy
// (the producer's page faults tripled with 960 KB inputs; docs/performance.md, "Big inputs in
// frames of their own"). The pool keeps the buffers of sent frames and hands them to the next
// copies instead: a buffer is reused for a frame of at least half its capacity. It keeps at most
// kMaxFreeBuffers buffers and kMaxFreeBytes bytes; frames of more than kMaxPooledBytes are not
// pooled. Memory the pool does not keep goes back to the allocator.
//
// Thread-safety: Copy from any thread; buffers come back from libzmq's I/O thread. The pool's
// state lives as long as the last message that came from it (messages may outlive the pool).

#include <cstddef>
#include <memory>
#include <zmq.hpp>

namespace ferry::client {

class FramePool {
 public:
  static constexpr size_t kMaxFreeBuffers = 32;
  static constexpr size_t kMaxFreeBytes = size_t{64} << 20;
  static constexpr size_t kMaxPooledBytes = size_t{16} << 20;

  FramePool();
  // A message holding a copy of data[0, size).
  zmq::message_t Copy(const void* data, size_t size);
  // Buffers waiting for reuse, and their bytes (tests).
  size_t free_buffers() const;
  size_t free_bytes() const;

  struct State;  // the buffers; shared with every message that holds one

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ferry::client
