#pragma once
// JobQueue: the worker's local queue between the I/O thread (which pushes the jobs of each
// CHUNK) and the executor threads (which take batches). FIFO; a batch is up to `max_batch`
// jobs of one model -- the model of the oldest queued job -- taken in arrival order, leaving
// the jobs of other models where they are.
//
// Bound: the queue is bounded by the broker's credit (the worker announces a capacity and the
// broker never sends more jobs than the credit it holds), so Push never blocks the I/O thread;
// `capacity` is only used to warn when a broker overruns it.
//
// Thread-safety: all methods may be called from any thread (one mutex, one condition variable).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "job.h"

namespace ferry::worker {

class JobQueue {
 public:
  explicit JobQueue(size_t capacity) : capacity_(capacity) {}

  // Appends jobs and wakes executors. Never blocks; returns false (after queueing anyway) when
  // the queue now holds more than `capacity` jobs.
  bool Push(std::vector<Job> jobs);

  // Blocks until there is work or the queue is closed. Moves up to `max_batch` jobs of the
  // oldest job's model into `out` (cleared first) and returns true; returns false once the
  // queue is closed and empty (queued jobs are still handed out after Close: drain).
  bool TakeBatch(size_t max_batch, std::vector<Job>* out);
  // The same with a per-model limit: `max_batch(model)` is asked once per batch, for the
  // oldest job's model (called under the queue's lock: it must not call back into the queue).
  bool TakeBatch(const std::function<size_t(const std::string& model)>& max_batch,
                 std::vector<Job>* out);

  // Removes the queued jobs with these ids (a CANCEL from the broker) and returns them. Jobs
  // already taken by an executor are not here any more: they run.
  std::vector<Job> Remove(const std::vector<std::string>& ids);

  // No more pushes; executors finish what is queued, then TakeBatch returns false.
  void Close();

  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool closed_ = false;
};

}  // namespace ferry::worker
