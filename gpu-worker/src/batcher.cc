#include "batcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <unordered_map>

#include "ferry/protocol/input_check.h"
#include "ferry/protocol/util.h"

namespace ferry::worker {

std::vector<JobResult> Batcher::Run(const Model& model, std::vector<Job> jobs,
                                    BatchLimit* limit) const {
  std::vector<JobResult> results(jobs.size());
  // Group by key, keeping the order of first appearance; jobs that do not match the inputs
  // the model's config declares, or that the padding policy rejects, fail alone. (The broker
  // checks the declared inputs too, but not always against this worker's: before any worker
  // announced them, or with another worker's in a rolling upgrade.)
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<std::string, size_t> group_of;
  const Padding& padding = model.padding();
  const auto& declared = model.config().inputs;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Status s = declared ? protocol::CheckInputs(model.name(), *declared, jobs[i].entry.inputs)
                        : Status::Ok();
    if (s.ok()) s = padding.Check(jobs[i].entry.inputs);
    if (!s.ok()) {
      results[i].status = std::move(s);
      continue;
    }
    auto [it, inserted] = group_of.emplace(padding.GroupKey(jobs[i].entry.inputs), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  for (const auto& group : groups) {
    const size_t cap = limit != nullptr
                           ? static_cast<size_t>(limit->Current(protocol::MonotonicMicros()))
                           : group.size();
    for (size_t from = 0; from < group.size(); from += cap) {
      const size_t to = std::min(group.size(), from + cap);
      MemoryReport report;
      RunGroup(model, jobs, std::vector<size_t>(group.begin() + from, group.begin() + to), &report,
               &results);
      // To the largest part that ran; when none did (a model whose batches are not split, or
      // every job short of memory), to half the batch, as much as halving would have tried.
      const int64_t n = static_cast<int64_t>(to - from);
      const int64_t target = report.largest_ok > 0 ? report.largest_ok : n / 2;
      if (report.out_of_memory && target > 0 && limit != nullptr) {
        const int64_t lowered = limit->LowerTo(target, protocol::MonotonicMicros());
        spdlog::warn(
            "model {}: out of memory on a batch of {}; max batch lowered to {} for a while",
            model.name(), n, lowered);
      }
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    results[i].job = std::move(jobs[i]);
    results[i].job.entry.inputs.clear();  // the refs die with the chunk
    results[i].job.chunk.reset();
  }
  return results;
}

void Batcher::RunGroup(const Model& model, const std::vector<Job>& jobs,
                       const std::vector<size_t>& indices, MemoryReport* report,
                       std::vector<JobResult>* results) const {
  std::vector<const std::vector<protocol::TensorRef>*> inputs;
  std::vector<std::shared_ptr<const void>> chunks;  // a batch read in place holds them
  inputs.reserve(indices.size());
  for (size_t i : indices) {
    inputs.push_back(&jobs[i].entry.inputs);
    chunks.push_back(jobs[i].chunk);
  }

  BatchOutput out;
  const int64_t start = protocol::NowMicros();
  Status s = model.Run(inputs, &out, stream_, &chunks);
  const int64_t end = protocol::NowMicros();
  forward_calls_.fetch_add(1);

  if (!s.ok() && out.out_of_memory) {
    out_of_memory_.fetch_add(1);
    report->out_of_memory = true;
  }
  if (s.ok())
    report->largest_ok = std::max(report->largest_ok, static_cast<int64_t>(indices.size()));
  if (!s.ok() && out.retry_smaller && indices.size() > 1) {
    spdlog::debug("model {}: batch of {} failed ({}); retrying in halves", model.name(),
                  indices.size(), s.message().substr(0, 200));
    const size_t half = indices.size() / 2;
    RunGroup(model, jobs, std::vector<size_t>(indices.begin(), indices.begin() + half), report,
             results);
    RunGroup(model, jobs, std::vector<size_t>(indices.begin() + half, indices.end()), report,
             results);
    return;
  }
  if (!s.ok() && !out.error_detail.empty()) {
    // The job's result carries the first line; the whole text (a TorchScript traceback, with
    // source paths) is for the operator: once, on one line, with the jobs it failed.
    std::string ids;
    for (size_t n = 0; n < indices.size() && n < 8; ++n)
      ids += (n ? "," : "") + jobs[indices[n]].entry.id;
    if (indices.size() > 8) ids += ",... (" + std::to_string(indices.size()) + " jobs)";
    std::string detail = out.error_detail;
    while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
    for (size_t at = detail.find('\n'); at != std::string::npos; at = detail.find('\n', at + 3))
      detail.replace(at, 1, " | ");
    spdlog::warn("model {}: job(s) {} failed with model_error \"{}\"; the library said: {}",
                 model.name(), ids, s.message(), detail);
  }
  for (size_t n = 0; n < indices.size(); ++n) {
    JobResult& r = (*results)[indices[n]];
    r.status = s;
    r.batch_size = static_cast<int64_t>(indices.size());
    r.compute_start_us = start;
    r.compute_end_us = end;
    if (s.ok()) {
      r.outputs = std::move(out.per_job[n]);
      r.outputs_owner = out.owner;
    }
  }
}

}  // namespace ferry::worker
