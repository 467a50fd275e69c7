#pragma once
// Model: one TorchScript module loaded on one device, and the only place in the worker that
// touches libtorch (model.cc; this header is torch-free through a pimpl).
//
// Run() is the batched forward: it stacks the inputs of B jobs whose input signatures are
// identical (same count, dtypes and shapes) into [B, ...] tensors with one allocation and one
// memcpy per job, calls forward under NoGradGuard + InferenceMode, and splits every output
// (a tensor, or a tuple/list of tensors, each with the batch dimension first) back into B
// per-job slices of one contiguous CPU tensor. Library exceptions (c10::Error, std::exception)
// become a Status with code model_error and the library's message; nothing throws out.
//
// Thread-safety: Run() may be called from several executor threads at once (TorchScript
// modules are safe for concurrent forward calls; the module is never mutated after Create).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/codec.h"
#include "ferry/status.h"

namespace ferry::worker {

// The outputs of one batched forward, split per job.
struct BatchOutput {
  // per_job[j][k]: output k of job j, without the batch dimension; the bytes live in `owner`.
  std::vector<std::vector<protocol::TensorRef>> per_job;
  std::shared_ptr<const void> owner;
  // On failure: true when forward itself (or moving the inputs) threw, so a smaller batch may
  // succeed; false when the outputs were unusable for any batch (wrong type, batch dim, dtype).
  bool retry_smaller = false;
};

class Model {
 public:
  // Loads `path` with torch::jit::load onto `device` ("cpu", "cuda", "cuda:N") and puts it in
  // eval mode. Fails with kInvalidArgument for a bad device string or a CUDA device without
  // CUDA, and kInternal when the file cannot be loaded.
  static Status Create(std::string name, const std::string& path, const std::string& device,
                       std::unique_ptr<Model>* out);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  const std::string& device() const { return device_; }

  // Runs forward on a batch of B = inputs.size() jobs; inputs[j] are job j's positional
  // arguments. Every job must have the same signature (checked; kInvalidArgument otherwise).
  // On success out->per_job has B entries.
  Status Run(const std::vector<const std::vector<protocol::TensorRef>*>& inputs,
             BatchOutput* out) const;

 private:
  struct Impl;
  Model(std::string name, std::string device, std::unique_ptr<Impl> impl);

  std::string name_;
  std::string device_;
  std::unique_ptr<Impl> impl_;
};

// Sets the number of intra-op threads libtorch uses (process-wide; call once at start-up).
void SetTorchThreads(int intra_op_threads);
// True when libtorch was built with CUDA and sees at least one device.
bool CudaAvailable();

}  // namespace ferry::worker
