#pragma once
// TorchScript models for the worker's engine tests, defined in worker_test_models.cc (the one
// test TU besides worker_batcher_test.cc that includes libtorch) and saved as real files, plus
// torch-free helpers to build jobs and read outputs.
//
//   double     x -> x * 2                                     (any float shape)
//   padded     (x [T, 4] float, lengths [B] int64) -> (x * 2 + 1, x.sum(1) [4], lengths,
//              T_padded as int64)                              (lengths passed by the policy)
//   stride2    x [T, 2] -> x[::2] * 1                          (encoder-like, ratio 0.5)
//   identity   x -> x                                          (conversion tests)
//   oom        x -> x + 1, but raises "CUDA out of memory" for batches over 2
//   big_a/b/c  x -> x + k, each with a 1 MiB parameter        (memory budget tests)
//   linear64   x [64] -> tanh(x @ W + b) [64]                  (concurrency tests)
//   methods    embed(x) = x * 3, forward(x) = x
//   linear8    x [8] -> x @ W [8, 3]                           (warmup with the wrong shape fails)
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/tensor.h"
#include "job.h"

namespace ferry::worker::testmodels {

// Saves the model (once per process) and returns its path.
std::string Path(const std::string& name);
// The directory "<prefix><pid>" under the test temp dir, created on first use and removed, with
// everything in it, when the process exits: ctest runs each test as its own process, and the
// model files each one writes (up to ~120 MB) must not pile up in /tmp.
std::filesystem::path ScratchDir(const std::string& prefix);
// Removes every scratch directory now (for a main() that leaves with _Exit).
void RemoveScratchDirs();
// The exact size of each big_* model's parameter.
inline constexpr int64_t kBigBytes = 1 << 20;

// A job whose inputs live in `inputs` (kept alive through Job::chunk, like a CHUNK message).
inline Job MakeJob(const std::string& id, const std::string& model, std::vector<Tensor> inputs) {
  auto owned = std::make_shared<std::vector<Tensor>>(std::move(inputs));
  Job job;
  job.entry.id = id;
  job.entry.model = model;
  for (const Tensor& t : *owned)
    job.entry.inputs.push_back({t.dtype, t.shape, t.data.data(), t.data.size()});
  job.chunk = owned;
  return job;
}

template <typename T>
std::vector<T> Values(const protocol::TensorRef& r) {
  std::vector<T> out(r.size / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), r.data, out.size() * sizeof(T));
  return out;
}

// A float tensor of `shape` whose element i is base + i * step.
inline Tensor Ramp(std::vector<int64_t> shape, float base, float step = 1.0f) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + step * static_cast<float>(i);
  return Tensor::From<float>(v, std::move(shape), DType::kFloat32);
}

}  // namespace ferry::worker::testmodels
