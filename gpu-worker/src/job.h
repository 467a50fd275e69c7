#pragma once
// Job and JobResult: what flows through the worker. A Job is one entry of a CHUNK whose input
// tensors still point into the received ZeroMQ message (no copy); a JobResult is what the
// ResultWriter stores in Redis and reports in DONE.
//
// Ownership: `Job::chunk` keeps the received message (and its msgpack object tree) alive for as
// long as any job references it; `JobResult::outputs_owner` does the same for the output bytes
// that `JobResult::outputs` point into. Both are type-erased so that this header needs neither
// zmq nor libtorch. Thread-safety: plain values, moved between threads through the queues.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::worker {

struct Job {
  protocol::ChunkJob entry;           // id, model, inputs (refs into `chunk`), attempt, ...
  std::shared_ptr<const void> chunk;  // owns the bytes entry.inputs point into
  int64_t received_us = 0;            // wall clock when the CHUNK arrived
};

struct JobResult {
  Job job;                                    // inputs/chunk are released once computed
  Status status;                              // ok: "done"; otherwise "failed" with code/message
  std::vector<protocol::TensorRef> outputs;   // when ok: one per model output, no batch dim
  std::shared_ptr<const void> outputs_owner;  // owns the bytes `outputs` point into
  int64_t batch_size = 0;                     // size of the batch that produced this result
  int64_t compute_start_us = 0;               // 0 when the job never reached the model
  int64_t compute_end_us = 0;
};

// A failed result for a job that never ran (bad entry, unknown model, internal error).
inline JobResult FailedResult(Job job, Status status) {
  JobResult r;
  r.job = std::move(job);
  r.job.entry.inputs.clear();
  r.job.chunk.reset();
  r.status = std::move(status);
  return r;
}

// The result of a job dropped by the broker's CANCEL before its batch started.
inline JobResult CancelledResult(Job job) {
  return FailedResult(std::move(job), Status(codes::kCancelled, "cancelled by request"));
}

}  // namespace ferry::worker
