#pragma once
// Batcher: turns the jobs an executor took for one model into results.
//
//  1. Checks each job against the model's padding policy (a job that cannot be padded fails
//     alone with invalid_argument) and groups the jobs by Padding::GroupKey, in order of first
//     appearance: without a policy that is the input signature (count, dtypes, shapes); with
//     one, the padded dimension compares by bucket. Each group is one batch [B, ...], cut into
//     pieces of at most the model's current BatchLimit.
//  2. Runs each batch through Model::Run (stack/pad -> device -> convert -> call -> split/trim)
//     on the executor's stream.
//  3. When a batch of B > 1 fails inside the call, splits it in halves and retries each half,
//     recursively, so that only the job(s) that make the model throw fail (code model_error,
//     the library's message) and their batch-mates still succeed. A batch that ran out of
//     memory lowers the model's BatchLimit, once its halves have run, to the largest of them
//     that ran without: the size the device is seen to take (one job too big for the device
//     alone, whose halves run out of memory down to itself, does not take it to 1); to half the
//     batch when none ran (a batch that is not split, every job short of memory). Failures
//     that no batch size can fix (outputs without the batch dimension, an output dtype Ferry
//     cannot encode) fail the whole group at once.
//
// Results come back one per job, in the order the jobs were given. The Batcher is torch-free:
// all libtorch work is inside Model. Thread-safety: Run() may be called concurrently (the only
// state is atomic counters); in the worker each executor has its own.

#include <atomic>
#include <cstdint>
#include <vector>

#include "batch_limit.h"
#include "cuda_support.h"
#include "job.h"
#include "model.h"

namespace ferry::worker {

class Batcher {
 public:
  // `stream` (may be null: the current stream) must outlive the batcher.
  explicit Batcher(const cuda::Stream* stream = nullptr) : stream_(stream) {}

  // Runs `jobs` (all for `model`; the caller checks the name) and returns one result per job,
  // in the same order. Consumes the jobs: inputs and chunk references are released once the
  // model has run. `limit` (may be null: no limit beyond the jobs given) caps each batch and
  // is lowered on out-of-memory errors.
  std::vector<JobResult> Run(const Model& model, std::vector<Job> jobs,
                             BatchLimit* limit = nullptr) const;

  // The number of model calls made since construction (for tests and stats).
  int64_t forward_calls() const { return forward_calls_.load(); }
  // The number of calls that ran out of device memory.
  int64_t out_of_memory() const { return out_of_memory_.load(); }

 private:
  // What the halvings of one batch saw: whether a call ran out of memory, and the largest call
  // that succeeded.
  struct MemoryReport {
    bool out_of_memory = false;
    int64_t largest_ok = 0;
  };
  // Runs jobs[indices...] as one batch, halving on failure; fills (*results)[index].
  void RunGroup(const Model& model, const std::vector<Job>& jobs,
                const std::vector<size_t>& indices, MemoryReport* report,
                std::vector<JobResult>* results) const;

  const cuda::Stream* stream_;
  mutable std::atomic<int64_t> forward_calls_{0};
  mutable std::atomic<int64_t> out_of_memory_{0};
};

}  // namespace ferry::worker
