#pragma once
// Executor: one inference thread. It takes a batch from the JobQueue (up to the model's
// current max batch, of the oldest job's model), holds the model through the ModelRegistry
// (loading it first when it is not resident; it is never unloaded while the batch runs), runs
// the batch through its Batcher and hands the results to the ResultWriter, whose thread writes
// them while this one computes the next batch. A job for a model
// this worker does not hold fails with unknown_model, a model that cannot be loaded fails its
// jobs with the load's Status, and anything unexpected fails the batch with internal -- no
// exception leaves the thread. The thread ends when the queue is closed and drained.
//
// Executors share one copy of each model's weights. On CUDA each executor has its own stream
// from the pool, so batches of different executors overlap on the device (copies of one with
// kernels of another) while the next batch is already stacked in pinned host memory.
//
// Thread-safety: Start/Join from the owner; the executor's state is its thread's own.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "batcher.h"
#include "cuda_support.h"
#include "job_queue.h"
#include "model_registry.h"
#include "result_writer.h"

namespace ferry::worker {

class WorkerMetrics;  // src/worker_metrics.h

class Executor {
 public:
  struct Options {
    int index = 0;
    std::string device = "cpu";     // the worker's device: a CUDA device gets a stream per executor
    int threads = 0;                // intra-op torch threads for this thread (0: leave as is)
    bool flush_denormals = false;   // CPU: denormals as zero in this thread and its intra-op team
    size_t default_max_batch = 32;  // for jobs of models the registry does not know
    std::string worker;             // the worker's name, for logs
    WorkerMetrics* metrics = nullptr;  // optional; must outlive the executor
  };

  // Everything passed in must outlive the executor; `queue` and `writer` may be null when only
  // RunBatch is used (tests).
  Executor(Options options, ModelRegistry* registry, JobQueue* queue, ResultWriter* writer);
  ~Executor();  // joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Start();
  // Waits for the thread to end (after the queue is closed and drained).
  void Join();

  // Sets up the calling thread as an executor thread: intra-op threads, denormal handling.
  // Before the thread's first batch (its intra-op team copies the denormal mode when it is
  // created). The thread's loop calls it first; public for tests that call RunBatch themselves.
  void PrepareThread();
  // Runs one batch synchronously (the thread's loop body; public for tests).
  std::vector<JobResult> RunBatch(std::vector<Job> jobs);

  const Batcher& batcher() const { return batcher_; }

  // The CUDA device index of "cuda" / "cuda:N"; -1 for anything else.
  static int CudaIndex(const std::string& device);

 private:
  void Loop();

  const Options options_;
  ModelRegistry* registry_;
  JobQueue* queue_;
  ResultWriter* writer_;
  std::shared_ptr<cuda::Stream> stream_;  // null on CPU
  Batcher batcher_;
  int64_t batches_ = 0;
  int64_t jobs_ = 0;
  std::thread thread_;
};

}  // namespace ferry::worker
