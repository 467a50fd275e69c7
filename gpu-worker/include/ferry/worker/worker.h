#pragma once
// Worker: ferry-worker as an object. Create() loads (and warms) every eager model -- a failure
// there is fatal: the caller exits 1 -- so the first READY goes out only once they are warm;
// lazy models load on their first batch. Run() wires the threads together and blocks until a
// requested stop has drained:
//
//   BrokerLink (I/O thread) --jobs--> JobQueue --batches--> Executor x instances
//        ^                                                      | results
//        +--- DoneReports (Outbox) --- ResultWriter (Redis) <---+
//
// READY lists every model the worker serves and, in "resident", those loaded and warm; each
// change of the resident set (a lazy load, an eviction under --memory-budget) re-announces it
// through the I/O thread (Outbox::RequestReady), so the broker can prefer workers that have a
// model warm.
//
// Lifetime: RequestStop() (from a signal-watching thread) makes the link drain -- no new
// credit, every held job run, written and reported, then BYE -- after which Run() closes the
// queue, joins the executors and the writer, and returns OK.
//
// Thread-safety: RequestStop() from any thread (not from a signal handler); the rest from the
// owning thread.

#include <memory>

#include "ferry/status.h"
#include "ferry/worker/options.h"

namespace ferry::worker {

class Worker {
 public:
  // Loads the models onto the device and sets the torch thread count. Fails (kInternal or
  // kInvalidArgument) when a model cannot be loaded or the device does not exist.
  static Status Create(WorkerOptions options, std::unique_ptr<Worker>* out);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Runs until a stop was requested and everything held is reported. Returns a failed Status
  // only when it cannot start (bad endpoint).
  Status Run();
  void RequestStop();

  const WorkerOptions& options() const;
  // The port /metrics is served on while running; 0 when off.
  int metrics_port() const;

 private:
  class Impl;  // src/worker.cc
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::worker
