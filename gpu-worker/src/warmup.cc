#include "warmup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ferry/protocol/redis_errors.h"
#include "ferry/protocol/util.h"

namespace ferry::worker {

Status WarmUp(const Model& model, int64_t max_batch, const cuda::Stream* stream,
              int64_t* batches_run) {
  if (batches_run) *batches_run = 0;
  const WarmupSpec& spec = model.config().warmup;
  if (spec.inputs.empty() || spec.iterations == 0) return Status::Ok();
  std::vector<int64_t> sizes = spec.batch_sizes;
  if (sizes.empty()) sizes = {1, max_batch};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  // One shape set per padding bucket (the padded dimension set to the bucket), or just one.
  const Padding& padding = model.padding();
  std::vector<std::vector<TensorSpec>> shape_sets;
  if (padding.enabled() && !padding.policy().buckets.empty()) {
    for (int64_t bucket : padding.policy().buckets) {
      std::vector<TensorSpec> set = spec.inputs;
      for (size_t k : padding.policy().inputs) {
        if (k >= set.size()) continue;
        const int64_t d = Padding::Normalize(padding.policy().dim, set[k].shape.size());
        if (d >= 0) set[k].shape[static_cast<size_t>(d)] = bucket;
      }
      shape_sets.push_back(std::move(set));
    }
  } else {
    shape_sets.push_back(spec.inputs);
  }

  const int64_t start = protocol::MonotonicMicros();
  int64_t runs = 0;
  for (const auto& set : shape_sets) {
    std::vector<std::string> buffers;
    std::vector<protocol::TensorRef> job;
    buffers.reserve(set.size());
    for (const TensorSpec& t : set) {
      const int64_t n = NumElements(t.shape);
      // One warmup input is at most what one job input can be (a stored input: one Redis value).
      if (n < 0 || static_cast<uint64_t>(n) * static_cast<uint64_t>(ItemSize(t.dtype)) >
                       protocol::kMaxValueDataBytes)
        return Status::InvalidArgument("warmup of model \"" + model.name() +
                                       "\": an input shape over " +
                                       std::to_string(protocol::kMaxValueDataBytes) + " bytes");
      buffers.emplace_back(static_cast<size_t>(n) * ItemSize(t.dtype), '\0');
      job.push_back({t.dtype, t.shape, buffers.back().data(), buffers.back().size()});
    }
    for (int64_t b : sizes) {
      std::vector<const std::vector<protocol::TensorRef>*> batch(static_cast<size_t>(b), &job);
      for (int64_t i = 0; i < spec.iterations; ++i) {
        BatchOutput out;
        Status s = model.Run(batch, &out, stream);
        if (!s.ok()) {
          return Status(s.code(), "warmup of model \"" + model.name() + "\" (batch " +
                                      std::to_string(b) + ") failed: " + s.message());
        }
        ++runs;
      }
    }
  }
  cuda::Synchronize(stream);
  if (batches_run) *batches_run = runs;
  spdlog::info("model {}: warmed up with {} batch(es) in {} ms", model.name(), runs,
               (protocol::MonotonicMicros() - start) / 1000);
  return Status::Ok();
}

}  // namespace ferry::worker
