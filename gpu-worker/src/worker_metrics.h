#pragma once
// WorkerMetrics: the series a worker exposes about itself (names in
// metrics/include/ferry/metrics/names.h; docs/operations.md lists them) and the hooks its
// threads call. Torch-free: device memory comes through cuda_support.h.
//
// Per-model series are made up front for every configured model, so a hook finds them with one
// hash lookup and no allocation; a model name the worker does not serve (a job for it fails)
// gets its series on first use, under a mutex. Residency and device memory are sampled before
// each scrape, on the HTTP thread, from the thread-safe ModelRegistry and CUDA allocator.
//
// Thread-safety: every method may be called from any thread.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/metrics/registry.h"
#include "ferry/worker/options.h"
#include "job.h"

namespace ferry::worker {

class ModelRegistry;

class WorkerMetrics {
 public:
  // `registry` and `models` must outlive this object.
  WorkerMetrics(metrics::Registry* registry, const WorkerOptions& options,
                const ModelRegistry* models);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Executor `executor` ran a batch of `size` jobs of `model`: forward time `compute_s`
  // (negative when it never reached the model) and `busy_s` on the executor in all.
  void OnBatch(int executor, const std::string& model, size_t size, double compute_s,
               double busy_s);
  // The result writer stored these results (`duplicates` of them lost to an earlier result).
  void OnWritten(const std::vector<JobResult>& results, int64_t duplicates);
  // A result round trip to Redis failed (it is retried).
  void OnWriteError();
  // Samples residency and device memory (before a scrape).
  void Sample();

 private:
  enum StatusIndex { kDone, kFailed, kCancelled, kExpired, kStatusCount };
  struct ModelSeries {
    metrics::Counter* batches;
    metrics::Counter* jobs[kStatusCount];
    metrics::Histogram* batch_size;
    metrics::Histogram* compute;
    metrics::Gauge* resident;
  };
  ModelSeries* Model(const std::string& name);
  std::unique_ptr<ModelSeries> MakeSeries(const std::string& name);

  metrics::Registry* registry_;
  const ModelRegistry* models_;
  const int cuda_index_;                                                      // -1 on CPU
  std::unordered_map<std::string, std::unique_ptr<ModelSeries>> configured_;  // never changes
  std::mutex mu_;                                                             // guards others_
  std::unordered_map<std::string, std::unique_ptr<ModelSeries>> others_;
  std::vector<metrics::Counter*> busy_;  // per executor
  metrics::Counter* duplicates_;
  metrics::Counter* write_errors_;
  metrics::Gauge* models_resident_;
  metrics::Gauge* memory_used_;
};

}  // namespace ferry::worker
