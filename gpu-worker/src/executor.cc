#include "ferry/worker/executor.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "ferry/protocol/util.h"

namespace ferry::worker {

Executor::Executor(int index, size_t max_batch, const ModelMap* models, JobQueue* queue,
                   ResultWriter* writer)
    : index_(index), max_batch_(max_batch), models_(models), queue_(queue), writer_(writer) {}

Executor::~Executor() { Join(); }

void Executor::Start() { thread_ = std::thread([this] { Loop(); }); }

void Executor::Join() {
  if (thread_.joinable()) thread_.join();
}

std::vector<JobResult> Executor::RunBatch(std::vector<Job> jobs) {
  std::vector<JobResult> results;
  if (jobs.empty()) return results;
  const std::string model_name = jobs.front().entry.model;
  auto it = models_->find(model_name);
  if (it == models_->end()) {
    for (auto& job : jobs) {
      results.push_back(FailedResult(
          std::move(job), Status(codes::kUnknownModel,
                                 "this worker does not serve model \"" + model_name + "\"")));
    }
    return results;
  }
  const int64_t start = protocol::MonotonicMicros();
  const size_t n = jobs.size();
  results = batcher_.Run(*it->second, std::move(jobs));
  size_t failed = 0;
  for (const auto& r : results) failed += r.status.ok() ? 0 : 1;
  ++batches_;
  jobs_ += static_cast<int64_t>(n);
  if (failed > 0) {
    const auto* bad = &results.front();
    for (const auto& r : results) {
      if (!r.status.ok()) { bad = &r; break; }
    }
    spdlog::warn("executor {}: model {} batch of {}: {} failed (first: job {}: {})", index_,
                 model_name, n, failed, bad->job.entry.id, bad->status.ToString().substr(0, 300));
  } else {
    spdlog::debug("executor {}: model {} batch of {} in {} us", index_, model_name, n,
                  protocol::MonotonicMicros() - start);
  }
  return results;
}

void Executor::Loop() {
  spdlog::debug("executor {}: started", index_);
  std::vector<Job> jobs;
  while (queue_->TakeBatch(max_batch_, &jobs)) {
    std::vector<JobResult> results;
    // Keep the ids: if something unexpected throws, the jobs may be gone with the exception.
    std::vector<Job> skeletons;
    skeletons.reserve(jobs.size());
    for (const auto& j : jobs) {
      Job s;
      s.entry.id = j.entry.id;
      s.entry.model = j.entry.model;
      s.entry.attempt = j.entry.attempt;
      s.entry.result_ttl_s = j.entry.result_ttl_s;
      s.entry.submitted_us = j.entry.submitted_us;
      s.entry.dispatched_us = j.entry.dispatched_us;
      s.received_us = j.received_us;
      skeletons.push_back(std::move(s));
    }
    try {
      results = RunBatch(std::move(jobs));
    } catch (const std::exception& e) {
      spdlog::error("executor {}: batch of {} failed unexpectedly: {}", index_,
                    skeletons.size(), e.what());
      results.clear();
      for (auto& s : skeletons)
        results.push_back(FailedResult(std::move(s), Status::Internal(e.what())));
    }
    writer_->Submit(std::move(results));
    jobs.clear();
  }
  spdlog::debug("executor {}: stopped after {} batches, {} jobs", index_, batches_, jobs_);
}

}  // namespace ferry::worker
