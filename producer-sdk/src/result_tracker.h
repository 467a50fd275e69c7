#pragma once
// ResultTracker: what this client knows about job results, per id, and Wait.
//
// Per id it knows one thing: pending, or has a result -- a notice said the result is in Redis,
// and if the notice carried the record inline, the record itself. Plus what the Redis re-check
// needs: whether the id is ours (submitted through this client, so a notice will come) and
// whether a notice may have been lost (read Redis now).
//
//   - Track(ids) before a SUBMIT is sent marks the ids as ours: a notice arriving before the
//     submitter even sees ACCEPTED is kept, and a Wait on an id of ours skips the first GET
//     (the notice says when to read).
//   - Notify(ids, records), from the I/O thread (FINISHED from the broker, or a worker's notice
//     on our channel), marks ours or waited-on ids as having a result and keeps inline records.
//     It never touches Redis. A later notice for an id that has a result but no record wakes
//     its Waits to read again: a worker's first notice may come before its record is stored
//     (docs/protocol.md, notices), and a Wait that read nothing then must not sleep until its
//     next re-check.
//   - Wait(id) returns the inline record when there is one (decoded on the waiting thread),
//     reads Redis once when a notice came without it, and otherwise re-checks Redis on its own
//     every 50 ms backing off to 1 s: the safety net for lost notices (a broker restart) and
//     for ids submitted elsewhere. The waiting thread does its own Redis reads; nothing else
//     does them for it.
//
// Bounds: at most kMaxTracked ids of ours without a waiter (beyond that Wait falls back to its
// first GET); inline records kept for nobody are capped at kMaxHeldBytes in all (beyond that the
// id's Wait reads Redis); entries nobody waits on are dropped kTrackTtl after their last change.
// A record is delivered once: the Wait that returns it (and any Waits on the same id at that
// moment) take it, and the entry goes. A later Wait on the id reads Redis. Likewise a result
// one Wait read from Redis goes to the Waits on the id at that moment.
//
// Thread-safety: every method may be called from any thread. One mutex guards all entries; no
// Redis call is made and no callback is run while it is held. Waiters sleep on their entry's
// condition variable; nothing outside a Wait call points into it, so a Wait that ends by an
// exception leaves nothing behind.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/result.h"
#include "ferry/status.h"

namespace ferry::client {

// How often a Wait re-checks Redis on its own: first after `first`, doubling to `max`. Tests set
// them long, so that only a notice can make a Wait read.
struct RecheckTimes {
  std::chrono::steady_clock::duration first = std::chrono::milliseconds(50);
  std::chrono::steady_clock::duration max = std::chrono::milliseconds(1000);
};

class ResultTracker {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxTracked = 65536;
  static constexpr size_t kMaxHeldBytes = size_t{64} << 20;
  static constexpr std::chrono::seconds kTrackTtl{60};

  // Reads one id's result from Redis (RedisStore::Read): ok with state kPending when there is
  // none yet. `timeout_ms` (> 0) is what is left of the Wait's time: the read should not take
  // longer (0: no such bound, the store's own timeout).
  using ReadFn = std::function<Status(const std::string& id, int timeout_ms, Result* out)>;
  // Called on the waiting thread, with no lock held, for each id whose Wait returned a record
  // that came inline (in a notice, not read from Redis): Client uses it to delete that result
  // from Redis too under consume_results. May be empty.
  using InlineTakenFn = std::function<void(const std::string& id)>;
  explicit ResultTracker(ReadFn read, InlineTakenFn inline_taken = nullptr,
                         RecheckTimes rechecks = {})
      : read_(std::move(read)), inline_taken_(std::move(inline_taken)), rechecks_(rechecks) {}

  // Marks ids as submitted by this client (call before sending them).
  void Track(const std::vector<std::string>& ids);
  // Forgets ids that were not accepted (rejected, or the SUBMIT got no answer).
  void Untrack(const std::vector<std::string>& ids);
  // The results of `ids` are in Redis; `records` holds some of them inline (id, the result
  // record's bytes). Never blocks on I/O.
  void Notify(const std::vector<std::string>& ids,
              const std::vector<std::pair<std::string_view, std::string_view>>& records = {});
  // Notices may have been lost (the result subscription failed): every id of ours without a
  // result is to be read from Redis by its Wait now.
  void RecheckOurs();

  // One submission's verdict, for a caller that does not wait for ACCEPTED (Client::Run): set
  // by Reject when the broker rejects that submission; the caller's own Wait(..., verdict) then
  // returns it. Scoped to the one call: other waiters on the id, and later submissions of it,
  // never see it. Shared by the reply handler and the call (the handler may run after the call).
  struct Verdict {
    bool rejected = false;  // guarded by the tracker's mutex
    Status why;             // likewise
  };
  // Records `why` in *verdict and wakes `id`'s waiters (the one it concerns returns it).
  void Reject(const std::string& id, Verdict* verdict, const Status& why);
  // Whether Reject was called on `verdict`; then *why (when given) is the rejection.
  bool Rejected(const Verdict& verdict, Status* why = nullptr) const;
  // Whether a notice said `id` has a result (a Wait will get it without the broker).
  bool Finished(const std::string& id) const;

  // Client::Wait's contract (see client.h); `id` is already validated. With `verdict`, also
  // returns its rejection as soon as Reject sets it (a result for the id still comes first).
  Status Wait(const std::string& id, int timeout_ms, Result* out, const Verdict* verdict = nullptr);

  // Ids with an entry (ours, waited on, or holding a result): how busy this client is, for the
  // choice of result notices at light load; and for tests.
  size_t Entries() const;
  // For tests: the Waits in progress on `id`.
  int Waiters(const std::string& id) const;

 private:
  struct Entry {
    bool ours = false;        // submitted through this client: a notice will come
    bool has_result = false;  // a notice said the result is in Redis
    bool recheck = false;     // read Redis now: a notice for it may have been lost
    std::string record;       // the notice's inline record ("" = read Redis)
    // A result one Wait read from Redis while others waited on the id too: theirs (a read
    // under consume_results deletes it from Redis).
    std::shared_ptr<const Result> read;
    uint64_t version = 0;        // +1 on every change a waiter must look at
    int waiters = 0;             // Wait calls in progress
    bool delivered = false;      // a Wait returned its result: drop the entry when waiters leave
    std::condition_variable cv;  // waiters sleep here (with mu_)
    Clock::time_point touched;
  };
  // Shared so that a notifier can wake an entry's waiters after it let go of the mutex (a waiter
  // woken under it would only block on the mutex again) without the entry going away meanwhile.
  using EntryMap = std::unordered_map<std::string, std::shared_ptr<Entry>>;
  using WakeList = std::vector<std::shared_ptr<Entry>>;
  class WaitScope;  // counts one Wait on an entry, and drops the entry as it leaves

  // Marks a change for the entry's waiters; they are woken by Wake once the mutex is released.
  static void Changed(const std::shared_ptr<Entry>& e, WakeList* wake);
  static void Wake(const WakeList& wake);
  // Moves the entry's record out (or drops it), keeping held_bytes_ in step.
  std::string TakeRecord(Entry* e);
  void Erase(EntryMap::iterator it);
  void MaybeSweep(Clock::time_point now);

  const ReadFn read_;
  const InlineTakenFn inline_taken_;
  const RecheckTimes rechecks_;
  mutable std::mutex mu_;
  EntryMap entries_;                // guarded by mu_
  size_t held_bytes_ = 0;           // guarded by mu_: inline records kept
  Clock::time_point last_sweep_{};  // guarded by mu_
};

}  // namespace ferry::client
