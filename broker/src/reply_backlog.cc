// ReplyBacklog: see reply_backlog.h.
#include "reply_backlog.h"

#include <algorithm>
#include <utility>

namespace ferry::broker {
namespace {

// A tracked reply: the body ZeroMQ sends from, and the count its bytes are in.
struct Held {
  zmq::message_t body;
  std::shared_ptr<std::atomic<int64_t>> count;
  int64_t bytes;
};

void Release(void* /*data*/, void* hint) {  // ZeroMQ's free function: any thread
  auto* held = static_cast<Held*>(hint);
  held->count->fetch_sub(held->bytes, std::memory_order_relaxed);
  delete held;
}

}  // namespace

bool ReplyBacklog::Fits(std::string_view producer, int64_t bytes) const {
  return queued(producer) + bytes <= inline_limit_;
}

bool ReplyBacklog::Admits(std::string_view producer, int64_t bytes) const {
  return queued(producer) + bytes <= reply_limit_;
}

int64_t ReplyBacklog::queued(std::string_view producer) const {
  auto it = counts_.find(std::string(producer));
  return it == counts_.end() ? 0 : it->second->load(std::memory_order_relaxed);
}

zmq::message_t ReplyBacklog::Track(std::string_view producer, zmq::message_t body, int64_t bytes) {
  if (bytes <= 0) return body;
  if (counts_.size() >= prune_at_) {  // connections come and go: forget the idle ones
    for (auto it = counts_.begin(); it != counts_.end();)
      it = it->second->load(std::memory_order_relaxed) == 0 ? counts_.erase(it) : std::next(it);
    prune_at_ = std::max<size_t>(64, 2 * counts_.size());
  }
  Count& count = counts_[std::string(producer)];
  if (!count) count = std::make_shared<std::atomic<int64_t>>(0);
  auto held = std::make_unique<Held>(Held{std::move(body), count, bytes});
  // After the move: a small body's bytes live inside the zmq::message_t itself, now in `held`.
  void* data = held->body.data();
  const size_t size = held->body.size();
  zmq::message_t tracked(data, size, &Release, held.get());
  count->fetch_add(bytes, std::memory_order_relaxed);
  held.release();  // ZeroMQ frees it (Release)
  return tracked;
}

}  // namespace ferry::broker
