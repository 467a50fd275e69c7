#include "finish_notices.h"

namespace ferry::client {

struct FinishNotices::Registration::Entry {
  uint64_t generation = 0;  // bumped by every FINISHED naming the id; guarded by owner's mu_
  int waiters = 0;          // registrations sharing this entry; guarded by owner's mu_
  std::condition_variable cv;
};

std::unique_ptr<FinishNotices::Registration> FinishNotices::Register(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& entry = entries_[id];
  if (!entry) entry = std::make_shared<Registration::Entry>();
  ++entry->waiters;
  return std::unique_ptr<Registration>(new Registration(this, id, entry));
}

FinishNotices::Registration::~Registration() {
  std::lock_guard<std::mutex> lock(owner_->mu_);
  if (--entry_->waiters == 0) owner_->entries_.erase(id_);
}

uint64_t FinishNotices::Registration::Generation() const {
  std::lock_guard<std::mutex> lock(owner_->mu_);
  return entry_->generation;
}

bool FinishNotices::Registration::SleepUntil(uint64_t seen,
                                             std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(owner_->mu_);
  return entry_->cv.wait_until(lock, until, [&] { return entry_->generation != seen; });
}

void FinishNotices::Notify(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // nobody waits: drop
    ++it->second->generation;
    it->second->cv.notify_all();
  }
}

size_t FinishNotices::WaitingIds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace ferry::client
