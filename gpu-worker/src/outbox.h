#pragma once
// Outbox: what other threads of the worker hand the I/O thread (BrokerLink) to tell the broker --
// the DONE report of each batch the ResultWriter wrote, and requests to re-announce (READY) after
// the resident models changed. Typed records, no encoding: the I/O thread alone encodes what it
// sends.
//
// Bounded: Push blocks while `capacity` reports wait (the I/O thread never blocks for long, so
// this only absorbs bursts). A Push or RequestReady wakes the I/O thread through fd() -- an
// eventfd it polls beside its socket -- only while it sleeps (it says so with Sleeping/Awake),
// so a busy I/O thread takes reports on its next turn without a wake-up per report.
//
// Thread-safety: every method from any thread; TakeAll from the I/O thread only.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::worker {

// One written batch, for DONE.
struct DoneReport {
  std::vector<std::string> ids;     // every job of the batch
  int64_t duplicates = 0;           // ids whose result another writer stored first
  protocol::DoneStatuses not_done;  // ids whose result is not "done", with their status
  // Records this write stored that are small enough to travel in DONE (id, record bytes).
  std::vector<std::pair<std::string, std::string>> inline_results;
  std::vector<std::string> notified;  // ids whose notice the write published on "notify"
};

class Outbox {
 public:
  explicit Outbox(size_t capacity) : capacity_(capacity) {}
  ~Outbox();
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // Creates the eventfd. internal when the system refuses one.
  Status Init();
  // The eventfd the I/O thread polls for reading.
  int fd() const { return fd_; }

  // Queues a report; blocks while the outbox is full. After Close, drops it (returns false).
  bool Push(DoneReport report);
  // Asks the I/O thread to send READY again.
  void RequestReady();
  // No more takers: Push returns at once (dropping) instead of blocking.
  void Close();

  // The I/O thread, before and after it polls: reports pushed while it sleeps wake it.
  // Sleeping returns false (and the thread should not sleep) when something waits already.
  // Awake(true) when poll found fd() readable: clears the eventfd.
  bool Sleeping();
  void Awake(bool fd_readable);
  // Moves everything queued into *reports (appended) and says whether READY was requested.
  void TakeAll(std::vector<DoneReport>* reports, bool* ready);

 private:
  // With mu_ held: whether the I/O thread sleeps and has not been woken yet (then the caller
  // writes the eventfd, after unlocking).
  bool NeedsWakeLocked();
  void Wake();

  const size_t capacity_;
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable not_full_;
  std::vector<DoneReport> reports_;  // guarded by mu_
  bool ready_ = false;               // guarded by mu_
  bool asleep_ = false;              // guarded by mu_
  bool woken_ = false;               // guarded by mu_: a wake-up was sent since Sleeping
  bool closed_ = false;              // guarded by mu_
};

}  // namespace ferry::worker
