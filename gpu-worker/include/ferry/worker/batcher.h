#pragma once
// Batcher: turns the jobs an executor took for one model into results.
//
//  1. Groups the jobs by input signature (count, dtypes, shapes), in order of first appearance:
//     each group is one sub-batch [B, ...]; jobs with other shapes run as their own sub-batches.
//  2. Runs each group through Model::Run (stack -> forward -> split).
//  3. When a group of B > 1 fails inside forward, splits it in halves and retries each half,
//     recursively, so that only the job(s) that make the model throw fail (code model_error, the
//     library's message) and their batch-mates still succeed. Failures that no batch size can
//     fix (outputs without the batch dimension, an output dtype Ferry cannot encode) fail the
//     whole group at once.
//
// Results come back one per job, in the order the jobs were given. The Batcher is torch-free:
// all libtorch work is inside Model. Thread-safety: Run() may be called concurrently (the only
// state is an atomic counter); in the worker each executor has its own.

#include <atomic>
#include <cstdint>
#include <vector>

#include "ferry/worker/job.h"
#include "ferry/worker/model.h"

namespace ferry::worker {

class Batcher {
 public:
  Batcher() = default;

  // Runs `jobs` (all for `model`; the caller checks the name) and returns one result per job,
  // in the same order. Consumes the jobs: inputs and chunk references are released once the
  // model has run.
  std::vector<JobResult> Run(const Model& model, std::vector<Job> jobs) const;

  // The number of forward calls made since construction (for tests and stats).
  int64_t forward_calls() const { return forward_calls_.load(); }

 private:
  // Runs jobs[indices...] as one batch, halving on failure; fills (*results)[index].
  void RunGroup(const Model& model, const std::vector<Job>& jobs,
                const std::vector<size_t>& indices, std::vector<JobResult>* results) const;

  mutable std::atomic<int64_t> forward_calls_{0};
};

}  // namespace ferry::worker
