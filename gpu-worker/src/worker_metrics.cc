#include "worker_metrics.h"

#include "cuda_support.h"
#include "executor.h"
#include "ferry/metrics/names.h"
#include "ferry/protocol/util.h"
#include "model_registry.h"

#ifndef FERRY_VERSION
#define FERRY_VERSION "unknown"
#endif

namespace ferry::worker {
namespace names = metrics::names;

namespace {
constexpr const char* kStatusNames[] = {"done", "failed", "cancelled", "expired"};
}  // namespace

WorkerMetrics::WorkerMetrics(metrics::Registry* registry, const WorkerOptions& options,
                             const ModelRegistry* models)
    : registry_(registry), models_(models), cuda_index_(Executor::CudaIndex(options.device)) {
  names::RegisterProcessInfo(registry_, "worker", FERRY_VERSION);
  registry_
      ->Gauge(names::kWorkerInfo, names::kWorkerInfoHelp,
              {{names::kLabelWorker, options.name},
               {names::kLabelDevice, options.device},
               {names::kLabelHost, protocol::HostName()}})
      ->Set(1);
  registry_->Gauge(names::kExecutors, names::kExecutorsHelp)
      ->Set(static_cast<double>(options.instances));
  for (int64_t i = 0; i < options.instances; ++i) {
    busy_.push_back(registry_->Counter(names::kExecutorBusy, names::kExecutorBusyHelp,
                                       {{names::kLabelExecutor, std::to_string(i)}}));
  }
  const metrics::Labels device = {{names::kLabelDevice, options.device}};
  registry_->Gauge(names::kDeviceMemoryBudget, names::kDeviceMemoryBudgetHelp, device)
      ->Set(static_cast<double>(options.memory_budget));
  memory_used_ = registry_->Gauge(names::kDeviceMemoryUsed, names::kDeviceMemoryUsedHelp, device);
  duplicates_ = registry_->Counter(names::kDuplicatesSuppressed, names::kDuplicatesSuppressedHelp);
  write_errors_ = registry_->Counter(names::kResultWriteErrors, names::kResultWriteErrorsHelp);
  models_resident_ = registry_->Gauge(names::kModelsResident, names::kModelsResidentHelp);
  for (const auto& m : options.models) configured_.emplace(m.name, MakeSeries(m.name));
}

std::unique_ptr<WorkerMetrics::ModelSeries> WorkerMetrics::MakeSeries(const std::string& name) {
  auto m = std::make_unique<ModelSeries>();
  const metrics::Labels model = {{names::kLabelModel, name}};
  m->batches = registry_->Counter(names::kBatches, names::kBatchesHelp, model);
  for (int s = 0; s < kStatusCount; ++s) {
    m->jobs[s] =
        registry_->Counter(names::kWorkerJobs, names::kWorkerJobsHelp,
                           {{names::kLabelModel, name}, {names::kLabelStatus, kStatusNames[s]}});
  }
  m->batch_size = registry_->Histogram(names::kBatchSize, names::kBatchSizeHelp,
                                       names::BatchSizeBuckets(), model);
  m->compute = registry_->Histogram(names::kJobComputeTime, names::kJobComputeTimeHelp,
                                    names::LatencyBuckets(), model);
  m->resident = registry_->Gauge(names::kModelResident, names::kModelResidentHelp, model);
  return m;
}

WorkerMetrics::ModelSeries* WorkerMetrics::Model(const std::string& name) {
  auto it = configured_.find(name);
  if (it != configured_.end()) return it->second.get();
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = others_[name];
  if (!slot) slot = MakeSeries(name);
  return slot.get();
}

void WorkerMetrics::OnBatch(int executor, const std::string& model, size_t size, double compute_s,
                            double busy_s) {
  if (executor >= 0 && static_cast<size_t>(executor) < busy_.size()) busy_[executor]->Add(busy_s);
  if (compute_s < 0) return;  // never reached the model (it could not be loaded)
  ModelSeries* m = Model(model);
  m->batches->Inc();
  m->batch_size->Observe(static_cast<double>(size));
  for (size_t i = 0; i < size; ++i) m->compute->Observe(compute_s);  // one per job
}

void WorkerMetrics::OnWritten(const std::vector<JobResult>& results, int64_t duplicates) {
  if (duplicates > 0) duplicates_->Inc(static_cast<uint64_t>(duplicates));
  ModelSeries* m = nullptr;
  const std::string* model = nullptr;  // results come in batches of one model
  for (const auto& r : results) {
    if (model == nullptr || r.job.entry.model != *model) {
      m = Model(r.job.entry.model);
      model = &r.job.entry.model;
    }
    int s = kFailed;
    if (r.status.ok())
      s = kDone;
    else if (r.status.code() == codes::kCancelled)
      s = kCancelled;
    else if (r.status.code() == codes::kExpired)
      s = kExpired;
    m->jobs[s]->Inc();
  }
}

void WorkerMetrics::OnWriteError() { write_errors_->Inc(); }

void WorkerMetrics::Sample() {
  if (models_ != nullptr) {
    size_t resident = 0;
    for (const auto& [name, series] : configured_) {
      const bool r = models_->IsResident(name);
      series->resident->Set(r ? 1 : 0);
      resident += r ? 1 : 0;
    }
    models_resident_->Set(static_cast<double>(resident));
  }
  // CUDA: the caching allocator's bytes; CPU: the registry's accounting of resident models.
  int64_t used = cuda_index_ >= 0 ? cuda::AllocatedBytes(cuda_index_) : -1;
  if (used < 0 && models_ != nullptr) used = models_->used_bytes();
  memory_used_->Set(static_cast<double>(used < 0 ? 0 : used));
}

}  // namespace ferry::worker
