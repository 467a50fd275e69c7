#include "executor.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "ferry/protocol/util.h"
#include "ferry/runtime/logging.h"
#include "ferry/runtime/thread_name.h"
#include "model.h"
#include "worker_metrics.h"

namespace ferry::worker {
namespace {

// A copy of `job` without its inputs and their bytes (`job` is left as it was): every field the
// result writer reads (id, model, attempt, ttl, timings, notify channel, stored inputs), so that
// a job failed from it is written and announced like any other.
Job Skeleton(Job* job) {
  std::vector<protocol::TensorRef> inputs = std::move(job->entry.inputs);
  Job s;
  s.entry = job->entry;
  s.received_us = job->received_us;
  job->entry.inputs = std::move(inputs);
  return s;
}

// Takes the jobs whose deadline has passed out of `jobs`, failed `expired`: they never reach the
// device. `when` says where, for the log.
std::vector<JobResult> TakeExpired(std::vector<Job>* jobs, int index, const char* when) {
  const int64_t now = protocol::NowMicros();
  std::vector<JobResult> expired;
  for (auto it = jobs->begin(); it != jobs->end();) {
    if (it->entry.deadline_us != 0 && now > it->entry.deadline_us) {
      expired.push_back(FailedResult(std::move(*it),
                                     Status(codes::kExpired, "not started within its timeout_ms")));
      it = jobs->erase(it);
    } else {
      ++it;
    }
  }
  if (!expired.empty())
    spdlog::info("executor {}: {} job(s) expired {} (first: {})", index, expired.size(), when,
                 expired.front().job.entry.id);
  return expired;
}

}  // namespace

int Executor::CudaIndex(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0) return -1;
  try {
    return std::stoi(device.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

Executor::Executor(Options options, ModelRegistry* registry, JobQueue* queue, ResultWriter* writer)
    : options_(std::move(options)),
      registry_(registry),
      queue_(queue),
      writer_(writer),
      stream_(CudaIndex(options_.device) >= 0 ? cuda::StreamFromPool(CudaIndex(options_.device))
                                              : nullptr),
      batcher_(stream_.get()) {}

Executor::~Executor() { Join(); }

void Executor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Executor::Join() {
  if (thread_.joinable()) thread_.join();
}

std::vector<JobResult> Executor::RunBatch(std::vector<Job> jobs) {
  std::vector<JobResult> results;
  if (jobs.empty()) return results;
  const std::string model_name = jobs.front().entry.model;
  const int64_t acquire_start = protocol::MonotonicMicros();
  ModelRegistry::Lease lease;
  Status s = registry_->Acquire(model_name, &lease, stream_.get());
  if (!s.ok()) {
    for (auto& job : jobs) results.push_back(FailedResult(std::move(job), s));
    logging::LogFields fields({{"model", model_name}, {"job_id", results.front().job.entry.id}});
    spdlog::warn("executor {}: model {}: {} job(s) failed (first: job {}): {}", options_.index,
                 model_name, results.size(), results.front().job.entry.id,
                 logging::Clip(s.ToString(), 4096));
    if (options_.metrics != nullptr)
      options_.metrics->OnBatch(options_.index, model_name, results.size(), -1,
                                (protocol::MonotonicMicros() - acquire_start) / 1e6);
    return results;
  }
  // Acquire may have loaded the model (seconds, or minutes for a big one): jobs whose deadline
  // passed meanwhile do not run either.
  std::vector<JobResult> expired = TakeExpired(&jobs, options_.index, "while their model loaded");
  if (jobs.empty()) return expired;
  const int64_t start = protocol::MonotonicMicros();
  const size_t n = jobs.size();
  {
    logging::LogFields fields({{"model", model_name}});  // on the batcher's log lines too
    results = batcher_.Run(lease.model(), std::move(jobs), lease.limit());
  }
  lease.Reset();
  const int64_t end = protocol::MonotonicMicros();
  if (options_.metrics != nullptr)
    options_.metrics->OnBatch(options_.index, model_name, n, (end - start) / 1e6,
                              (end - acquire_start) / 1e6);
  size_t failed = 0;
  for (const auto& r : results) failed += r.status.ok() ? 0 : 1;
  ++batches_;
  jobs_ += static_cast<int64_t>(n);
  if (failed > 0) {
    const auto* bad = &results.front();
    for (const auto& r : results) {
      if (!r.status.ok()) {
        bad = &r;
        break;
      }
    }
    logging::LogFields fields({{"model", model_name}, {"job_id", bad->job.entry.id}});
    spdlog::warn("executor {}: model {} batch of {}: {} failed (first: job {}: {})", options_.index,
                 model_name, n, failed, bad->job.entry.id,
                 logging::Clip(bad->status.ToString(), 4096));
  } else {
    spdlog::debug("executor {}: batch {}.{} worker {} device {} model {} size {} in {} us",
                  options_.index, options_.index, batches_, options_.worker, options_.device,
                  model_name, n, end - start);
  }
  for (auto& r : expired) results.push_back(std::move(r));
  return results;
}

void Executor::PrepareThread() {
  // The denormal mode first: threads started from here (set_num_threads may build a pool)
  // copy it.
  if (options_.flush_denormals && !SetFlushDenormals(true))
    spdlog::warn("executor {}: --flush-denormals: this CPU cannot flush denormals; ignored",
                 options_.index);
  SetTorchThreads(options_.threads);  // per thread with OpenMP
}

void Executor::Loop() {
  runtime::NameThisThread("ferry-exec-" + std::to_string(options_.index));
  PrepareThread();
  spdlog::debug("executor {}: started on {} ({})", options_.index, options_.device,
                cuda::Describe(stream_.get()));
  const auto limit = [this](const std::string& model) {
    return registry_->MaxBatch(model, options_.default_max_batch);
  };
  std::vector<Job> jobs;
  while (queue_->TakeBatch(limit, &jobs)) {
    std::vector<JobResult> results;
    // A job whose deadline passed while it waited here never reaches the device.
    std::vector<JobResult> expired = TakeExpired(&jobs, options_.index, "before their batch ran");
    if (!expired.empty()) {
      writer_->Submit(std::move(expired));
      if (jobs.empty()) continue;
    }
    // Keep the jobs but their inputs: if something unexpected throws, the jobs may be gone with
    // the exception, and their results still need their ids, notify channels, timings.
    std::vector<Job> skeletons;
    skeletons.reserve(jobs.size());
    for (auto& j : jobs) skeletons.push_back(Skeleton(&j));
    try {
      results = RunBatch(std::move(jobs));
    } catch (const std::exception& e) {
      spdlog::error("executor {}: batch of {} failed unexpectedly: {}", options_.index,
                    skeletons.size(), e.what());
      results.clear();
      // Producers read this: the first meaningful line, clipped, not a backtrace.
      const std::string why = SummarizeModelError(e.what());
      for (auto& s : skeletons)
        results.push_back(FailedResult(std::move(s), Status::Internal(why)));
    }
    writer_->Submit(std::move(results));  // written while this thread computes the next batch
    jobs.clear();
  }
  spdlog::debug("executor {}: stopped after {} batches, {} jobs", options_.index, batches_, jobs_);
}

}  // namespace ferry::worker
