#pragma once
// ResultTracker: Wait() without a Redis round trip per job.
//
// The broker sends this client FINISHED (a list of ids) when results it submitted are in Redis.
// The tracker turns those notices into batched reads:
//   - Track(ids) before a SUBMIT is sent marks the ids as ours, so a FINISHED arriving before
//     the submitter even sees ACCEPTED is not lost, and so Wait() on an id of ours that has no
//     notice yet skips the speculative first GET (the notice will say when to read).
//   - Notify(ids) (whichever thread drives the socket, FINISHED) marks tracked or waited-on ids "finished" and
//     queues them as ready; it never touches Redis. Results that came inside the FINISHED
//     (inline records: the same bytes as in Redis) are held at once instead: their Wait
//     decodes them and never reads Redis.
//   - The first Wait() that needs a finished id claims every ready id (up to kMaxBatchRead) and
//     reads them all with one MGET, outside the lock; results for the other ids are held for
//     their waiters (now or later), who then return without touching Redis.
//   - The safety net is unchanged: an id with no notice is re-read with a GET every 50 ms,
//     backing off to 1 s (lost notices after a broker restart; ids submitted elsewhere).
//
// Bounds: at most kMaxTracked ids are tracked without a waiter (beyond that Wait falls back to
// a first GET); held results of ids nobody waits on are capped at kMaxHeldBytes (beyond that
// the id's Wait does its own GET); entries nobody waits on are dropped kTrackTtl after their
// last change (e.g. jobs submitted and never waited for).
//
// Waiting: a Wait blocks through the Parking (the FrontendConnection), which lets the waiting
// thread drive the broker socket itself while nobody else does -- so at light load the FINISHED
// notice is received, dispatched and consumed on the waiting thread, with no other thread woken.
//
// Thread-safety: all methods are safe to call concurrently; one mutex guards the state, and no
// Redis call is made while holding it, nor is the Parking awaited (lock order: mu_, then the
// Parking's own lock through Signal).

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/result.h"
#include "ferry/status.h"
#include "result_store.h"
#include "waiter.h"

namespace ferry::client {

class ResultTracker {
 public:
  static constexpr size_t kMaxTracked = 65536;
  static constexpr size_t kMaxBatchRead = 1024;
  static constexpr size_t kMaxHeldBytes = size_t{64} << 20;
  static constexpr std::chrono::seconds kTrackTtl{60};

  // Both must outlive the tracker.
  ResultTracker(ResultStore* store, Parking* parking) : store_(store), parking_(parking) {}

  // Marks ids as submitted by this client (call before sending them).
  void Track(const std::vector<std::string>& ids);
  // Forgets ids that were not accepted (rejected, or the SUBMIT got no answer).
  void Untrack(const std::vector<std::string>& ids);
  // FINISHED: the results of `ids` are in Redis; `records` holds some of them inline (id, the
  // result record's bytes). Called by the socket's driver; never blocks on I/O.
  void Notify(const std::vector<std::string>& ids,
              const std::vector<std::pair<std::string_view, std::string_view>>& records = {});
  // One submission's verdict, for a caller that does not wait for ACCEPTED (Client::Run): set by
  // Reject when the broker rejects that submission; the caller's own Wait(..., verdict) then
  // returns it. Scoped to the one call: other waiters on the id, and later submissions of it,
  // never see it. Shared by the reply handler and the call (the handler may run after the call).
  struct Verdict {
    bool rejected = false;  // guarded by the tracker's mutex
    Status why;             // likewise
  };
  // Records `why` in *verdict and wakes `id`'s waiters (the one it concerns returns it).
  void Reject(const std::string& id, Verdict* verdict, const Status& why);
  // Whether a notice said `id` has a result (held, or about to be read): a Wait will get it.
  bool Finished(const std::string& id) const;
  // Notices may have been lost (the result push subscription failed): every id of ours without
  // a notice is to be read from Redis by its next Wait at once, as after a notice.
  void RecheckSubmitted();
  // Client::Wait's contract (see client.h); `id` is already validated. With `verdict`, also
  // returns its rejection as soon as Reject sets it (a result for the id still comes first).
  Status Wait(const std::string& id, int timeout_ms, Result* out,
              const Verdict* verdict = nullptr);

  // For tests: ids with an entry (tracked, waited on, or holding a result).
  size_t Entries() const;

 private:
  enum class State {
    kUnknown,    // a waiter's id with no notice (not ours, or tracking was full)
    kSubmitted,  // ours, no notice yet
    kFinished,   // noticed, queued in ready_, not read yet
    kReading,    // in some waiter's MGET
    kHeld,       // read: `result` holds it (or `raw`, an inline record not decoded yet)
    kNoticed,    // noticed but not held (read failed or over the byte cap): waiter GETs
  };
  struct Entry {
    State state = State::kUnknown;
    std::vector<Waiter*> waiters;  // signaled on every state change
    size_t held_bytes = 0;
    Result result;
    std::string raw;  // kHeld from an inline record: decoded by the first Wait
    std::chrono::steady_clock::time_point touched;
  };
  using EntryMap = std::unordered_map<std::string, std::unique_ptr<Entry>>;

  // Reads the ready ids (id first), stores the results. Called and returns with `lock` held.
  Status ReadReady(const std::string& id, std::unique_lock<std::mutex>& lock);
  void SetState(Entry* e, State s);
  // Waiter `w` of `it` is done; drops the entry when nothing else needs it.
  void Leave(EntryMap::iterator it, Waiter* w);
  void Erase(EntryMap::iterator it);
  void MaybeSweep(std::chrono::steady_clock::time_point now);

  ResultStore* const store_;
  Parking* const parking_;
  mutable std::mutex mu_;
  EntryMap entries_;               // guarded by mu_
  std::deque<std::string> ready_;  // guarded by mu_: ids in kFinished (plus stale names)
  size_t held_bytes_ = 0;          // guarded by mu_: results held for nobody yet
  std::chrono::steady_clock::time_point last_sweep_;  // guarded by mu_
};

}  // namespace ferry::client
