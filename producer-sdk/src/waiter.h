#pragma once
// Waiter and Parking: how a producer's thread blocks for a reply or a result.
//
// A blocked thread owns a Waiter; whoever completes what it waits for calls Signal on it. The
// Parking (the FrontendConnection) decides how the thread blocks: while no other thread runs
// the broker socket, the waiting thread runs it itself -- sends, receives and dispatches --
// so a reply reaches its caller without waking another thread (docs/architecture.md, "The
// producer SDK"). ResultTracker depends only on this interface, not on ZeroMQ.

#include <atomic>
#include <chrono>
#include <condition_variable>

namespace ferry::client {

struct Waiter {
  // Set by Signal; the waiter clears it before it checks its condition again.
  std::atomic<bool> signaled{false};
  // The Parking's own bookkeeping (guarded by its mutex): whether the thread sleeps on `cv`,
  // and its place in the Parking's list of sleeping waiters.
  bool parked = false;
  Waiter* prev_parked = nullptr;
  Waiter* next_parked = nullptr;
  std::condition_variable cv;
};

class Parking {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Parking() = default;
  // Blocks until `w` is signaled (true) or `deadline` passes (false). Never call it while
  // holding a lock that Signal's callers take.
  virtual bool Await(Waiter* w, Clock::time_point deadline) = 0;
  // Marks `w` signaled and wakes its thread. Any thread; never blocks on I/O.
  virtual void Signal(Waiter* w) = 0;
};

}  // namespace ferry::client
