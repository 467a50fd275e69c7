#pragma once
// Executor: one inference thread. It takes a batch from the JobQueue (up to max_batch jobs of
// one model), finds the model, runs the batch through its Batcher and hands the results to the
// ResultWriter. A job for a model this worker does not hold fails with unknown_model; anything
// unexpected fails the batch with internal -- no exception leaves the thread. The thread ends
// when the queue is closed and drained.
//
// A later issue gives each executor its own CUDA stream; the executor is where it will live.
// Thread-safety: Start/Join from the owner; the executor's state is its thread's own.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "ferry/worker/batcher.h"
#include "ferry/worker/job_queue.h"
#include "ferry/worker/model.h"
#include "ferry/worker/result_writer.h"

namespace ferry::worker {

using ModelMap = std::map<std::string, std::unique_ptr<Model>>;

class Executor {
 public:
  // Everything passed in must outlive the executor.
  Executor(int index, size_t max_batch, const ModelMap* models, JobQueue* queue,
           ResultWriter* writer);
  ~Executor();  // joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Start();
  // Waits for the thread to end (after the queue is closed and drained).
  void Join();

  // Runs one batch synchronously (the thread's loop body; public for tests).
  std::vector<JobResult> RunBatch(std::vector<Job> jobs);

 private:
  void Loop();

  const int index_;
  const size_t max_batch_;
  const ModelMap* models_;
  JobQueue* queue_;
  ResultWriter* writer_;
  Batcher batcher_;
  int64_t batches_ = 0;
  int64_t jobs_ = 0;
  std::thread thread_;
};

}  // namespace ferry::worker
