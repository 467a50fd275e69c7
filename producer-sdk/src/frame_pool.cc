#include "frame_pool.h"

#include <cstring>
#include <mutex>
#include <vector>

namespace ferry::client {

struct FramePool::State {
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
  };
  mutable std::mutex mu;
  std::vector<Buffer> free;  // guarded by mu; reserved: Give never allocates
  size_t free_bytes = 0;     // guarded by mu

  State() { free.reserve(kMaxFreeBuffers); }

  // The smallest free buffer that holds `size` bytes and is at most twice that, or a new one.
  Buffer Take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu);
      size_t best = free.size();
      for (size_t i = 0; i < free.size(); ++i) {
        const size_t c = free[i].capacity;
        if (c >= size && c / 2 <= size && (best == free.size() || c < free[best].capacity))
          best = i;
      }
      if (best < free.size()) {
        Buffer b = std::move(free[best]);
        free[best] = std::move(free.back());
        free.pop_back();
        free_bytes -= b.capacity;
        return b;
      }
    }
    return Buffer{std::unique_ptr<char[]>(new char[size]), size};
  }
  void Give(Buffer b) {
    if (b.capacity > kMaxPooledBytes) return;
    std::lock_guard<std::mutex> lock(mu);
    if (free.size() >= kMaxFreeBuffers || free_bytes + b.capacity > kMaxFreeBytes) return;
    free_bytes += b.capacity;
    free.push_back(std::move(b));
  }
};

namespace {
// What libzmq hands back with a sent frame's bytes: the buffer's owner and its capacity.
struct Lease {
  std::shared_ptr<FramePool::State> state;
  size_t capacity;
};
}  // namespace

FramePool::FramePool() : state_(std::make_shared<State>()) {}

zmq::message_t FramePool::Copy(const void* data, size_t size) {
  if (size == 0 || size > kMaxPooledBytes) return zmq::message_t(data, size);
  State::Buffer b = state_->Take(size);
  std::memcpy(b.data.get(), data, size);
  auto lease = std::make_unique<Lease>(Lease{state_, b.capacity});
  // libzmq calls this on its I/O thread once the frame is sent (or dropped); it never throws.
  zmq::message_t m(
      b.data.get(), size,
      [](void* d, void* hint) {
        std::unique_ptr<Lease> l(static_cast<Lease*>(hint));
        l->state->Give({std::unique_ptr<char[]>(static_cast<char*>(d)), l->capacity});
      },
      lease.get());
  b.data.release();  // the message owns both now (a throwing constructor left them to us)
  lease.release();
  return m;
}

size_t FramePool::free_buffers() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->free.size();
}

size_t FramePool::free_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->free_bytes;
}

}  // namespace ferry::client
