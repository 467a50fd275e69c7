#include "result_tracker.h"

#include <algorithm>

#include "ferry/protocol/messages.h"

namespace ferry::client {
namespace {

constexpr auto kSweepEvery = std::chrono::seconds(5);

}  // namespace

// One Wait on an entry, from its start to its end, however it ends (an exception included):
// counts the waiter, and drops the entry when the last waiter leaves and nothing is left to
// keep (its result was delivered, or it was never ours).
class ResultTracker::WaitScope {
 public:
  WaitScope(ResultTracker* tracker, std::unique_lock<std::mutex>* lock, const std::string& id,
            Entry* entry)
      : tracker_(tracker), lock_(lock), id_(id), entry_(entry) {
    ++entry_->waiters;
  }
  ~WaitScope() {
    if (!lock_->owns_lock()) lock_->lock();
    if (--entry_->waiters > 0) return;
    if (!entry_->delivered && entry_->ours) return;  // ours, not read yet: a later Wait may
    // Entries with waiters are never erased, so the id still finds this entry.
    tracker_->Erase(tracker_->entries_.find(id_));
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  ResultTracker* tracker_;
  std::unique_lock<std::mutex>* lock_;
  const std::string& id_;
  Entry* entry_;
};

void ResultTracker::Changed(const std::shared_ptr<Entry>& e, WakeList* wake) {
  ++e->version;
  e->touched = Clock::now();
  if (e->waiters > 0) wake->push_back(e);
}

void ResultTracker::Wake(const WakeList& wake) {
  for (const auto& e : wake) e->cv.notify_all();
}

std::string ResultTracker::TakeRecord(Entry* e) {
  held_bytes_ -= e->record.size();
  std::string record = std::move(e->record);
  e->record.clear();
  return record;
}

void ResultTracker::Erase(EntryMap::iterator it) {
  TakeRecord(it->second.get());
  entries_.erase(it);
}

void ResultTracker::Track(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      if (entries_.size() >= kMaxTracked) break;  // Wait falls back to its first GET
      it = entries_.emplace(id, std::make_shared<Entry>()).first;
    }
    it->second->ours = true;
    it->second->touched = now;
  }
  MaybeSweep(now);
}

void ResultTracker::Untrack(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second->has_result) continue;
    it->second->ours = false;
    if (it->second->waiters == 0) Erase(it);
  }
}

void ResultTracker::Notify(
    const std::vector<std::string>& ids,
    const std::vector<std::pair<std::string_view, std::string_view>>& records) {
  WakeList wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, record] : records) {
      auto it = entries_.find(std::string(id));
      if (it == entries_.end() || !it->second->record.empty()) continue;
      Entry* e = it->second.get();
      if (e->waiters == 0 && held_bytes_ + record.size() > kMaxHeldBytes) continue;  // read later
      e->record.assign(record.data(), record.size());
      held_bytes_ += e->record.size();
      e->has_result = true;
      Changed(it->second, &wake);
    }
    for (const auto& id : ids) {
      auto it = entries_.find(id);
      if (it == entries_.end()) continue;  // not ours, not waited on
      const Entry& e = *it->second;
      // A second notice for an id with a result but no record wakes its Waits to read again:
      // the first may have come before the record was stored (a write Redis refused at first).
      if (e.has_result && (!e.record.empty() || e.waiters == 0)) continue;
      it->second->has_result = true;
      Changed(it->second, &wake);
    }
    MaybeSweep(Clock::now());
  }
  Wake(wake);
}

void ResultTracker::RecheckOurs() {
  WakeList wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : entries_) {
      if (!e->ours || e->has_result) continue;
      e->recheck = true;
      Changed(e, &wake);
    }
  }
  Wake(wake);
}

void ResultTracker::Reject(const std::string& id, Verdict* verdict, const Status& why) {
  WakeList wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    verdict->rejected = true;
    verdict->why = why;
    auto it = entries_.find(id);
    // No entry: its Wait has not started, and looks at the verdict first. The others on the id
    // look and sleep on.
    if (it != entries_.end() && it->second->waiters > 0) wake.push_back(it->second);
  }
  Wake(wake);
}

bool ResultTracker::Rejected(const Verdict& verdict, Status* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (verdict.rejected && why != nullptr) *why = verdict.why;
  return verdict.rejected;
}

bool ResultTracker::Finished(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second->has_result;
}

void ResultTracker::MaybeSweep(Clock::time_point now) {
  if (now - last_sweep_ < kSweepEvery) return;
  last_sweep_ = now;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = *it->second;
    if (e.waiters == 0 && now - e.touched > kTrackTtl) {
      held_bytes_ -= e.record.size();
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

Status ResultTracker::Wait(const std::string& id, int timeout_ms, Result* out,
                           const Verdict* verdict) {
  const bool forever = timeout_ms < 0;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::milliseconds(std::max(0, timeout_ms));
  Clock::duration backoff = rechecks_.first;

  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    it = entries_.emplace(id, std::make_shared<Entry>()).first;
    it->second->touched = start;
  }
  Entry* e = it->second.get();  // stable: entries with waiters are never erased
  WaitScope scope(this, &lock, id, e);
  // Ours and no result yet: the notice says when to read, so skip the first GET (unless the
  // caller asked for exactly one check), though not for all of a Wait shorter than the first
  // re-check: that one reads halfway (its notice may have been lost with a broker), with the
  // other half for the read.
  Clock::time_point next_read = start;
  if (e->ours && !e->has_result && !e->recheck && timeout_ms != 0) {
    next_read =
        start + (forever ? backoff : std::min<Clock::duration>(backoff, (deadline - start) / 2));
    backoff = std::min<Clock::duration>(backoff * 2, rechecks_.max);
  }
  uint64_t seen = e->version;
  Status last;
  bool last_ran_out = false;  // the last read failed at the Wait's own deadline
  while (true) {
    if (e->read) {  // another Wait read it from Redis
      *out = *e->read;
      return Status::Ok();
    }
    if (e->has_result && !e->record.empty()) {
      // An inline record: decoded here, outside the lock. Others waiting on the id get a copy.
      std::string record = e->waiters > 1 ? e->record : TakeRecord(e);
      lock.unlock();
      Result r;
      const Status d = protocol::DecodeResult(record.data(), record.size(), &r);
      if (d.ok() && inline_taken_) inline_taken_(id);  // no lock held (see header)
      lock.lock();
      if (d.ok()) {
        e->delivered = true;
        *out = std::move(r);
        return Status::Ok();
      }
      TakeRecord(e);  // not usable: read Redis (below)
      next_read = Clock::now();
    }
    if (verdict != nullptr && verdict->rejected) {
      *out = Result();
      out->id = id;
      return verdict->why;
    }
    Clock::time_point now = Clock::now();
    if (e->version != seen) {  // a notice without its record, or a recheck: read now
      seen = e->version;
      if (e->has_result || e->recheck) next_read = now;
    }
    if (now >= next_read) {
      e->recheck = false;
      lock.unlock();
      Result r;
      // Bounded by what is left of the timeout (at least 1 ms), so that a stalled Redis does not
      // hold the Wait for the store's whole timeout; a Wait that checks once gets that.
      int read_timeout_ms = 0;
      if (!forever && timeout_ms > 0)
        read_timeout_ms = static_cast<int>(std::max<int64_t>(
            1, std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count()));
      const Status s = read_(id, read_timeout_ms, &r);
      lock.lock();
      if (s.ok() && r.state != JobState::kPending) {
        e->delivered = true;
        if (e->waiters > 1) {  // theirs too: under consume_results Redis no longer has it
          e->read = std::make_shared<const Result>(r);
          ++e->version;
          e->cv.notify_all();
        }
        *out = std::move(r);
        return s;
      }
      // Redis unreachable: keep trying until the deadline (it may be restarting).
      if (!s.ok() && s.code() != codes::kUnavailable) {
        *out = std::move(r);
        return s;
      }
      last = s;
      // A read cut off by the Wait's own bound: Redis is slow, not gone, and the Wait timed out.
      last_ran_out = read_timeout_ms > 0 && Clock::now() + std::chrono::milliseconds(1) >= deadline;
      next_read = Clock::now() + backoff;
      backoff = std::min<Clock::duration>(backoff * 2, rechecks_.max);
      continue;  // a notice may have come during the read
    }
    if (!forever && now >= deadline) {
      *out = Result();
      out->id = id;
      if (!last.ok() && !last_ran_out) return last;
      return Status::Timeout("no result for job \"" + id + "\" within " +
                             std::to_string(timeout_ms) + " ms");
    }
    e->cv.wait_until(lock, forever ? next_read : std::min(next_read, deadline));
  }
}

size_t ResultTracker::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

int ResultTracker::Waiters(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? 0 : it->second->waiters;
}

}  // namespace ferry::client
