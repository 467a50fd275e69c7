#include "ferry/worker/batcher.h"

#include <spdlog/spdlog.h>

#include <string>
#include <unordered_map>

#include "ferry/protocol/util.h"

namespace ferry::worker {
namespace {

// A key equal for two jobs exactly when their inputs can be stacked: count, dtypes, shapes.
std::string SignatureKey(const std::vector<protocol::TensorRef>& inputs) {
  std::string key;
  for (const auto& t : inputs) {
    key += std::to_string(static_cast<int>(t.dtype));
    key += '[';
    for (int64_t d : t.shape) {
      key += std::to_string(d);
      key += ',';
    }
    key += ']';
  }
  return key;
}

}  // namespace

std::vector<JobResult> Batcher::Run(const Model& model, std::vector<Job> jobs) const {
  std::vector<JobResult> results(jobs.size());
  // Group by signature, keeping the order of first appearance.
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto [it, inserted] = group_of.emplace(SignatureKey(jobs[i].entry.inputs), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  for (const auto& group : groups) RunGroup(model, jobs, group, &results);
  for (size_t i = 0; i < jobs.size(); ++i) {
    results[i].job = std::move(jobs[i]);
    results[i].job.entry.inputs.clear();  // the refs die with the chunk
    results[i].job.chunk.reset();
  }
  return results;
}

void Batcher::RunGroup(const Model& model, const std::vector<Job>& jobs,
                       const std::vector<size_t>& indices,
                       std::vector<JobResult>* results) const {
  std::vector<const std::vector<protocol::TensorRef>*> inputs;
  inputs.reserve(indices.size());
  for (size_t i : indices) inputs.push_back(&jobs[i].entry.inputs);

  BatchOutput out;
  const int64_t start = protocol::NowMicros();
  Status s = model.Run(inputs, &out);
  const int64_t end = protocol::NowMicros();
  forward_calls_.fetch_add(1);

  if (!s.ok() && out.retry_smaller && indices.size() > 1) {
    spdlog::debug("model {}: batch of {} failed ({}); retrying in halves", model.name(),
                  indices.size(), s.message().substr(0, 200));
    const size_t half = indices.size() / 2;
    RunGroup(model, jobs, std::vector<size_t>(indices.begin(), indices.begin() + half), results);
    RunGroup(model, jobs, std::vector<size_t>(indices.begin() + half, indices.end()), results);
    return;
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
