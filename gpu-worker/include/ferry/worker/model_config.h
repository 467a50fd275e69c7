#pragma once
// ModelConfig: one entry of the model repository -- a `[models.NAME]` table of the TOML file
// given with `--models FILE`, or a `--model NAME=PATH` shorthand (every field at its default).
// docs/models.md is the prose version of this header; keep them in step.
//
// The parser reports the first problem with the file name, the line and the key
// ("models.toml:12: models.resnet.max_batch: must be 1..65536"); unknown keys are errors, so a
// typo never silently falls back to a default. Torch-free. Thread-safety: plain values.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::worker {

// A tensor without its batch dimension: what warmup feeds the model.
struct TensorSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

// A conversion done on the device after the host-to-device copy, so that producers may send
// compact dtypes (uint8 pixels are 4x fewer bytes than float32):
//   x = x.to(to) * scale;  then, when mean/std are given, x = (x - mean[c]) / std[c]
// with c running along `channel_dim` of the job's tensor (no batch dimension).
struct InputConversion {
  size_t input = 0;            // positional index of the input
  DType to = DType::kFloat32;  // dtype the model wants (a floating dtype when scale/mean/std)
  double scale = 1.0;
  std::vector<double> mean;  // empty, or one value per channel (same length as std)
  std::vector<double> std;
  int64_t channel_dim = 0;
};

// Trims output `output` of every job back along `dim` (of the job's output, no batch dimension)
// to ceil(true_length * ratio) -- e.g. ratio 0.5 for an encoder with stride 2.
struct TrimRule {
  size_t output = 0;
  int64_t dim = 0;
  double ratio = 1.0;
};

// Variable-length inputs: jobs whose `inputs` differ only in dimension `dim` run as one batch,
// padded with `value` to the longest in the batch, or -- when `buckets` is given -- to the
// smallest bucket that holds it (jobs are grouped by bucket; a job longer than the last bucket
// runs padded to its own length). Every listed input of a job must have the same length there.
struct PaddingPolicy {
  std::vector<size_t> inputs;  // empty: no padding (jobs group by identical shapes)
  int64_t dim = 0;             // in the job's tensor; negative counts from the end
  double value = 0.0;
  std::vector<int64_t> buckets;  // strictly ascending, > 0
  bool pass_lengths = false;     // append the true lengths as one more input, int64 [B]
  std::vector<TrimRule> trim;
  bool enabled() const { return !inputs.empty(); }
};

// Batches of zeros run when the model loads, before it is announced as resident, so that
// cudnn autotuning and the TorchScript profiling executor settle on the shapes in use.
struct WarmupSpec {
  std::vector<TensorSpec> inputs;    // one per model input, in the wire dtype; empty: no warmup
  std::vector<int64_t> batch_sizes;  // empty: 1 and max_batch
  int64_t iterations = 2;            // per batch size (and per padding bucket)
};

enum class LoadPolicy { kEager, kLazy };

struct ModelConfig {
  std::string name;                // 1-128 characters, unique
  std::string path;                // a TorchScript file (torch.jit.save)
  std::string device;              // "" = the worker's --device
  int64_t max_batch = 0;           // 0 = the worker's --max-batch
  std::string method = "forward";  // the module method a batch calls
  std::vector<InputConversion> convert;
  bool half = false;  // weights and floating inputs in float16 (CUDA only);
                      // floating outputs come back as float32
  PaddingPolicy padding;
  WarmupSpec warmup;
  bool pinned = false;  // never evicted under --memory-budget
  // Every batch copied into tensors of the worker's own, never read where the jobs' bytes are
  // (model.h): for a model that writes into its inputs where PyTorch cannot see it.
  bool copy_inputs = false;
  LoadPolicy load = LoadPolicy::kEager;
  // `inputs`: the job inputs the model takes, as sent on the wire (before `convert`, without the
  // batch dimension and without the lengths input padding adds); -1 in a shape matches any size.
  // Announced in READY; the broker rejects jobs that do not match. nullopt: not declared.
  std::optional<std::vector<protocol::InputSpec>> inputs;
};

// Reads and validates a repository file. Fails with kInvalidArgument and a message naming the
// file, line and key; `out` is cleared first.
Status ParseModelRepository(const std::string& path, std::vector<ModelConfig>* out);
// The same from text; `source` names it in messages.
Status ParseModelRepositoryText(std::string_view text, const std::string& source,
                                std::vector<ModelConfig>* out);

// Checks one entry's values (also for --model entries): name, indices, buckets, dtypes, and the
// input specs (at most 64 inputs of at most 16 dims, each >= -1; names 0-64 characters of
// [A-Za-z0-9._-]; warmup inputs agreeing with them in count, dtype and rank).
Status ValidateModelConfig(const ModelConfig& config);

// Parses a byte count: "1048576", "512M", "2G", "1.5G", "64K", "1T" (powers of 1024; an
// optional trailing "B" or "iB" is accepted). Fails with kInvalidArgument.
Status ParseByteSize(std::string_view text, int64_t* out);

const char* LoadPolicyName(LoadPolicy load);

}  // namespace ferry::worker
