#include "outbox.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::worker {

Outbox::~Outbox() {
  if (fd_ >= 0) close(fd_);
}

Status Outbox::Init() {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
  return Status::Ok();
}

bool Outbox::NeedsWakeLocked() {
  if (!asleep_ || woken_) return false;
  woken_ = true;
  return true;
}

void Outbox::Wake() {
  uint64_t one = 1;
  if (write(fd_, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is already non-zero; the thread wakes anyway.
  }
}

bool Outbox::Push(DoneReport report) {
  bool wake;
  {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [this] { return closed_ || reports_.size() < capacity_; });
    if (closed_) return false;
    reports_.push_back(std::move(report));
    wake = NeedsWakeLocked();
  }
  if (wake) Wake();
  return true;
}

void Outbox::RequestReady() {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = true;
    wake = NeedsWakeLocked();
  }
  if (wake) Wake();
}

void Outbox::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  not_full_.notify_all();
}

bool Outbox::Sleeping() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reports_.empty() || ready_) return false;
  asleep_ = true;
  woken_ = false;
  return true;
}

void Outbox::Awake(bool fd_readable) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    asleep_ = false;
  }
  // A wake-up written after the thread woke for another reason is read on a later turn: one
  // spare turn, never a lost report (TakeAll looks at the queue every turn).
  if (fd_readable) {
    uint64_t count;
    if (read(fd_, &count, sizeof(count)) < 0) {
      // EAGAIN: nothing to clear.
    }
  }
}

void Outbox::TakeAll(std::vector<DoneReport>* reports, bool* ready) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : reports_) reports->push_back(std::move(r));
  reports_.clear();
  *ready = ready_;
  ready_ = false;
  not_full_.notify_all();
}

}  // namespace ferry::worker
