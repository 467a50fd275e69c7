#include "result_tracker.h"

#include <algorithm>

#include "ferry/protocol/messages.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kFirstRecheck = std::chrono::milliseconds(50);
constexpr auto kMaxRecheck = std::chrono::milliseconds(1000);
constexpr auto kSweepEvery = std::chrono::seconds(5);

}  // namespace

void ResultTracker::SetState(Entry* e, State s) {
  e->state = s;
  e->touched = Clock::now();
  for (Waiter* w : e->waiters) parking_->Signal(w);
}

void ResultTracker::Erase(EntryMap::iterator it) {
  held_bytes_ -= it->second->held_bytes;
  entries_.erase(it);
}

void ResultTracker::Leave(EntryMap::iterator it, Waiter* w) {
  Entry* e = it->second.get();
  e->waiters.erase(std::find(e->waiters.begin(), e->waiters.end(), w));
  if (!e->waiters.empty()) return;
  // Keep what a later Wait can still use: an id of ours not read yet. A held result was
  // delivered (consumed); unknown/noticed ids are re-read by a later Wait anyway.
  if (e->state == State::kSubmitted || e->state == State::kFinished ||
      e->state == State::kReading)
    return;
  Erase(it);
}

void ResultTracker::Track(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      if (entries_.size() >= kMaxTracked) return;  // Wait falls back to its first GET
      it = entries_.emplace(id, std::make_unique<Entry>()).first;
      it->second->state = State::kSubmitted;
      it->second->touched = now;
    } else if (it->second->state == State::kUnknown) {
      SetState(it->second.get(), State::kSubmitted);
    }
  }
}

void ResultTracker::Untrack(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second->state != State::kSubmitted) continue;
    if (it->second->waiters.empty())
      Erase(it);
    else
      SetState(it->second.get(), State::kUnknown);
  }
}

void ResultTracker::Notify(
    const std::vector<std::string>& ids,
    const std::vector<std::pair<std::string_view, std::string_view>>& records) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, record] : records) {
    auto it = entries_.find(std::string(id));
    if (it == entries_.end()) continue;
    Entry* e = it->second.get();
    if (e->state == State::kReading || e->state == State::kHeld) continue;
    if (e->waiters.empty() && held_bytes_ + record.size() > kMaxHeldBytes) continue;  // read later
    e->raw.assign(record.data(), record.size());
    e->held_bytes = record.size();
    held_bytes_ += e->held_bytes;
    SetState(e, State::kHeld);  // a stale name in ready_ is skipped (not kFinished)
  }
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // neither ours nor waited on: drop
    Entry* e = it->second.get();
    if (e->state == State::kUnknown || e->state == State::kSubmitted ||
        e->state == State::kNoticed) {
      ready_.push_back(id);
      SetState(e, State::kFinished);
    }
  }
  MaybeSweep(Clock::now());
}

void ResultTracker::Reject(const std::string& id, Verdict* verdict, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  verdict->rejected = true;
  verdict->why = why;
  auto it = entries_.find(id);
  if (it == entries_.end()) return;  // its Wait has not started: it looks at the verdict first
  for (Waiter* w : it->second->waiters) parking_->Signal(w);  // the others look and sleep on
}

bool ResultTracker::Finished(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  const State st = it->second->state;  // not kNoticed: also "re-read, notices may be lost"
  return st == State::kFinished || st == State::kReading || st == State::kHeld;
}

void ResultTracker::RecheckSubmitted() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) {
    if (e->state == State::kSubmitted) SetState(e.get(), State::kNoticed);
  }
}

void ResultTracker::MaybeSweep(Clock::time_point now) {
  if (now - last_sweep_ < kSweepEvery) return;
  last_sweep_ = now;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = *it->second;
    if (e.waiters.empty() && e.state != State::kReading && now - e.touched > kTrackTtl) {
      held_bytes_ -= e.held_bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  if (ready_.size() > entries_.size()) {  // drop the names of swept or already-read ids
    std::deque<std::string> kept;
    for (auto& id : ready_) {
      auto it = entries_.find(id);
      if (it != entries_.end() && it->second->state == State::kFinished) kept.push_back(id);
    }
    ready_.swap(kept);
  }
}

Status ResultTracker::ReadReady(const std::string& id, std::unique_lock<std::mutex>& lock) {
  std::vector<std::string> ids{id};
  SetState(entries_.at(id).get(), State::kReading);
  while (!ready_.empty() && ids.size() < kMaxBatchRead) {
    std::string next = std::move(ready_.front());
    ready_.pop_front();
    auto it = entries_.find(next);
    if (it == entries_.end() || it->second->state != State::kFinished) continue;
    SetState(it->second.get(), State::kReading);
    ids.push_back(std::move(next));
  }
  lock.unlock();
  std::vector<ResultStore::Fetched> reads;
  Status s = store_->ReadMany(ids, &reads);  // one MGET, decoded outside the lock
  lock.lock();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = entries_.find(ids[i]);
    if (it == entries_.end() || it->second->state != State::kReading) continue;
    Entry* e = it->second.get();
    const bool usable = s.ok() && reads[i].status.ok() && reads[i].result.state != JobState::kPending;
    if (usable && (!e->waiters.empty() || held_bytes_ + reads[i].bytes <= kMaxHeldBytes)) {
      e->result = std::move(reads[i].result);
      e->held_bytes = reads[i].bytes;
      held_bytes_ += e->held_bytes;
      SetState(e, State::kHeld);
    } else {
      SetState(e, State::kNoticed);  // its waiter reads it alone (and sees any error)
    }
  }
  return s;
}

Status ResultTracker::Wait(const std::string& id, int timeout_ms, Result* out,
                           const Verdict* verdict) {
  const bool forever = timeout_ms < 0;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(std::max(0, timeout_ms));
  auto recheck = std::chrono::duration_cast<Clock::duration>(kFirstRecheck);

  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    it = entries_.emplace(id, std::make_unique<Entry>()).first;
    it->second->touched = start;
  }
  Entry* e = it->second.get();  // stable: entries with waiters are never erased
  Waiter self;
  e->waiters.push_back(&self);
  // Ours and not finished yet: the FINISHED notice says when to read, so skip the first GET
  // (unless the caller asked for exactly one check).
  Clock::time_point next_read = start;
  if (e->state == State::kSubmitted && timeout_ms != 0) {
    next_read = start + recheck;
    recheck = std::min<Clock::duration>(recheck * 2, kMaxRecheck);
  }
  Status last = Status::Ok();
  while (true) {
    // Cleared under mu_ before the state is looked at: a change after this signals again.
    self.signaled.store(false, std::memory_order_relaxed);
    if (e->state == State::kFinished) last = ReadReady(id, lock);
    if (e->state == State::kHeld && !e->raw.empty()) {
      // An inline record (small: decoding it under the lock is cheaper than a hand-off).
      Status d = protocol::DecodeResult(e->raw.data(), e->raw.size(), &e->result);
      e->raw.clear();
      e->raw.shrink_to_fit();
      if (!d.ok()) SetState(e, State::kNoticed);  // not usable: read Redis below
    }
    if (e->state == State::kHeld) {
      if (e->waiters.size() > 1)
        *out = e->result;
      else
        *out = std::move(e->result);
      Leave(entries_.find(id), &self);
      return Status::Ok();
    }
    if (verdict != nullptr && verdict->rejected && e->state != State::kReading) {
      *out = Result();
      out->id = id;
      Leave(entries_.find(id), &self);
      return verdict->why;
    }
    Clock::time_point now = Clock::now();
    if (e->state == State::kNoticed) next_read = now;  // finished but not held: read it now
    if (e->state != State::kReading && now >= next_read) {
      lock.unlock();
      Result r;
      Status s = store_->Read(id, &r);
      lock.lock();
      if (e->state == State::kHeld || e->state == State::kFinished) continue;  // raced a notice
      if (s.ok() && r.state != JobState::kPending) {
        if (e->waiters.size() > 1) {  // the others get it too
          e->result = r;
          SetState(e, State::kHeld);
        } else {
          e->state = State::kUnknown;  // delivered: nothing left to track for this id
        }
        *out = std::move(r);
        Leave(entries_.find(id), &self);
        return s;
      }
      // Redis unreachable: keep trying until the deadline (it may be restarting).
      if (!s.ok() && s.code() != codes::kUnavailable) {
        *out = std::move(r);
        Leave(entries_.find(id), &self);
        return s;
      }
      if (e->state == State::kNoticed) SetState(e, State::kUnknown);
      last = s;
      now = Clock::now();
      next_read = now + recheck;
      recheck = std::min<Clock::duration>(recheck * 2, kMaxRecheck);
    }
    if (!forever && now >= deadline) {
      *out = Result();
      out->id = id;
      Leave(entries_.find(id), &self);
      if (!last.ok()) return last;
      return Status::Timeout("no result for job \"" + id + "\" within " +
                             std::to_string(timeout_ms) + " ms");
    }
    // kReading: another waiter's MGET includes this id; it wakes us when done.
    Clock::time_point until =
        e->state == State::kReading ? now + kMaxRecheck : next_read;
    if (!forever) until = std::min(until, deadline);
    lock.unlock();
    parking_->Await(&self, until);  // may drive the socket: FINISHED notices land meanwhile
    lock.lock();
  }
}

size_t ResultTracker::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace ferry::client
