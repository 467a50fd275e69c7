#pragma once
// Worker: ferry-worker as an object. Create() loads (and warms) every eager model -- a failure
// there is fatal: the caller exits 1 -- so the first READY goes out only once they are warm;
// lazy models load on their first batch. Run() wires the threads together and blocks until a
// requested stop has drained:
//
//   BrokerLink (I/O thread) --jobs--> JobQueue --batches--> Executor x instances
//        ^                                                      | results
//        +---- DONE ids (inproc) ---- ResultWriter (Redis) <----+
//
// READY lists every model the worker serves and, in "resident", those loaded and warm; each
// change of the resident set (a lazy load, an eviction under --memory-budget) re-announces it
// through the I/O thread, so the broker can prefer workers that have a model warm.
//
// Lifetime: RequestStop() (from a signal-watching thread) makes the link drain -- no new
// credit, every held job run, written and reported, then BYE -- after which Run() closes the
// queue, joins the executors and the writer, and returns OK.
//
// Thread-safety: RequestStop() from any thread (not from a signal handler); the rest from the
// owning thread.

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>
#include <zmq.hpp>

#include "ferry/status.h"
#include "ferry/worker/broker_link.h"
#include "ferry/worker/executor.h"
#include "ferry/worker/job_queue.h"
#include "ferry/worker/model_registry.h"
#include "ferry/worker/options.h"
#include "ferry/worker/result_writer.h"

namespace ferry::metrics {
class MetricsServer;
class Registry;
}  // namespace ferry::metrics

namespace ferry::worker {

class WorkerMetrics;  // src/worker_metrics.h

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

  const WorkerOptions& options() const { return options_; }
  ModelRegistry& registry() { return *registry_; }
  // What READY says now: every model, the resident ones, capacity, identity.
  protocol::WorkerHello Hello() const;
  // The port /metrics is served on while running; 0 when off.
  int metrics_port() const;

 private:
  Worker(WorkerOptions options, std::unique_ptr<ModelRegistry> registry);
  // Re-announces (READY through the I/O thread's outbox) after the resident set changed.
  void AnnounceResidency();

  const WorkerOptions options_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<metrics::Registry> metrics_registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;  // started by Run with a port
  JobQueue queue_;
  zmq::context_t context_;

  std::mutex mu_;  // guards link_ against RequestStop during Run's start-up and shutdown
  std::atomic<bool> stop_requested_{false};
  std::unique_ptr<ResultWriter> writer_;
  std::unique_ptr<BrokerLink> link_;
  std::vector<std::unique_ptr<Executor>> executors_;
  std::mutex announce_mu_;                   // guards announce_ (a PUSH into the outbox)
  std::unique_ptr<zmq::socket_t> announce_;  // null unless running
};

}  // namespace ferry::worker
