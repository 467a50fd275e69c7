#include "result_deleter.h"

#include <algorithm>

namespace ferry::client {

ResultDeleter::~ResultDeleter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ResultDeleter::Add(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || queued_.size() >= kMaxQueued) return;  // it expires with its TTL instead
  queued_.push_back(id);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  if (queued_.size() == 1) cv_.notify_one();
}

void ResultDeleter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  Status last;  // of the latest round trip
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queued_.empty(); });
    // Stopping: one last round trip at most, none if the latest one failed (Redis is then
    // likely unreachable, and each attempt could take request_timeout_ms); the rest expire.
    const bool last_round = stop_;
    if (queued_.empty() || (last_round && !last.ok())) return;
    std::vector<std::string> ids;
    if (queued_.size() <= kMaxPerRoundTrip) {
      ids.swap(queued_);
    } else {
      ids.assign(queued_.begin(), queued_.begin() + kMaxPerRoundTrip);
      queued_.erase(queued_.begin(), queued_.begin() + kMaxPerRoundTrip);
    }
    lock.unlock();
    last = store_->DeleteResults(ids);  // best effort (header)
    lock.lock();
    if (last_round) return;
  }
}

}  // namespace ferry::client
