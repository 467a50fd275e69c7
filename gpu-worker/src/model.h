#pragma once
// Model: one TorchScript module loaded on one device, and the only place in the worker that
// touches libtorch for inference (model.cc; this header is torch-free through a pimpl).
//
// Run() is the batched call of the configured method (default `forward`):
//  1. stacks the inputs of B jobs into [B, ...] tensors with one allocation and one copy per
//     job -- in pinned host memory when the model is on CUDA -- padding the dimension named by
//     the padding policy to the batch's target length with the pad value; on the CPU, an input
//     whose bytes already lie back to back for the batch (stored inputs fetched together:
//     input_fetcher.h; any batch of one job) is read where it is, unless the model has been
//     seen writing into its inputs (then it gets copies from that batch on, and that batch is
//     not retried; writes_into_inputs() says so, for Create to be told again when the model is
//     loaded anew) or its config says copy_inputs;
//  2. copies them to the device (non-blocking from pinned memory, on the caller's stream);
//  3. converts dtypes on the device (e.g. uint8 pixels -> float, scale, mean/std), casts
//     floating inputs to float16 for half-precision models, appends the true lengths [B] int64
//     when the policy asks for them;
//  4. calls the method under InferenceMode, and splits every output (a tensor, or a
//     tuple/list of tensors, each batch-first) back per job, trimming outputs named by the
//     policy back to each job's own length.
// Library exceptions (c10::Error, std::exception) become a Status with code model_error and
// the library's first meaningful line (SummarizeModelError; the whole text is in
// BatchOutput::error_detail); an out-of-memory error is flagged so the caller can halve the batch.
// Nothing throws out.
//
// Thread-safety: Run() may be called from several executor threads at once, each with its own
// stream (TorchScript modules are safe for concurrent calls; the module is never mutated after
// Create).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_support.h"
#include "ferry/protocol/types.h"
#include "ferry/status.h"
#include "ferry/worker/model_config.h"
#include "padding.h"

namespace ferry::worker {

// The outputs of one batched call, split per job.
struct BatchOutput {
  // per_job[j][k]: output k of job j, without the batch dimension; the bytes live in `owner`.
  std::vector<std::vector<protocol::TensorRef>> per_job;
  std::shared_ptr<const void> owner;
  // On failure: true when the call itself (or moving the inputs) threw, so a smaller batch may
  // succeed; false when the outputs were unusable for any batch (wrong type, batch dim, dtype).
  bool retry_smaller = false;
  // On failure: the device ran out of memory (c10::OutOfMemoryError or "out of memory").
  bool out_of_memory = false;
  // On failure from a library exception whose text is more than the status's message (a
  // TorchScript traceback, with source paths): the whole text, for the worker's log. The
  // status carries only SummarizeModelError's line, since results go back to producers.
  std::string error_detail;
};

class Model {
 public:
  // Loads config.path with torch::jit::load onto config.device ("cpu", "cuda", "cuda:N"; must
  // be set), casts it to float16 when config.half (ferry/worker/half_precision.h), and puts it
  // in eval mode. Measures its memory (memory_bytes()). Fails with kInvalidArgument for a bad
  // device string, a CUDA device without CUDA, half on CPU or a missing method, and kInternal
  // when the file cannot be loaded. `writes_into_inputs`: the model was seen writing into its
  // inputs before (writes_into_inputs() of an earlier load of it): it gets copies from its first
  // batch on, as if copy_inputs.
  static Status Create(const ModelConfig& config, std::unique_ptr<Model>* out,
                       bool writes_into_inputs = false);
  // Shorthand: a default config with name, path and device.
  static Status Create(std::string name, const std::string& path, const std::string& device,
                       std::unique_ptr<Model>* out);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return config_.name; }
  const std::string& device() const { return config_.device; }
  const ModelConfig& config() const { return config_; }
  const Padding& padding() const { return padding_; }
  // Device memory the model holds: on CUDA the caching allocator's growth across the load (at
  // least parameter_bytes()); on CPU parameter_bytes().
  int64_t memory_bytes() const { return memory_bytes_; }
  // The bytes of its parameters, buffers and other tensor attributes, each tensor once; for a
  // module with none (a frozen one: its weights are constants in its code), its file's size.
  int64_t parameter_bytes() const { return parameter_bytes_; }
  // Whether the model has been seen writing into inputs it was given in place (from then on it
  // gets copies), or was created knowing it does (Create's `writes_into_inputs`).
  bool writes_into_inputs() const;

  // Runs the method on a batch of B = inputs.size() jobs; inputs[j] are job j's positional
  // arguments. Every job must have the same signature up to the padded dimension (checked;
  // kInvalidArgument otherwise). `stream` (may be null) is made current for the whole call.
  // `keep_alive` (may be null): what keeps the inputs' bytes alive (the jobs' Job::chunk); when
  // given, on the CPU an input whose bytes already lie back to back for the batch is read where
  // it is, and the tensor holds `keep_alive` for as long as it or a view of it (an output,
  // something the module keeps) lives. On success out->per_job has B entries.
  Status Run(const std::vector<const std::vector<protocol::TensorRef>*>& inputs, BatchOutput* out,
             const cuda::Stream* stream = nullptr,
             const std::vector<std::shared_ptr<const void>>* keep_alive = nullptr) const;

 private:
  struct Impl;
  Model(ModelConfig config, std::unique_ptr<Impl> impl);

  ModelConfig config_;
  Padding padding_;
  int64_t memory_bytes_ = 0;
  int64_t parameter_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

// The line of a library exception's text that a job's model_error carries: for an error raised
// in the TorchScript interpreter ("The following operation failed in the TorchScript
// interpreter. Traceback of TorchScript ... <--- HERE\n    <source>\nRuntimeError: <msg>"), the
// first line after the last "<--- HERE" that is not indented source ("RuntimeError: <msg>"; a
// "builtins." prefix is dropped); otherwise the first non-empty line. Blanks are trimmed.
std::string SummarizeModelError(std::string_view text);

// Sets the number of intra-op threads libtorch uses. Call it in every executor thread (with
// OpenMP the setting is per thread) and once at start-up.
void SetTorchThreads(int intra_op_threads);
// Float denormals read and written as zero (the CPU's FTZ and DAZ modes) in the calling thread,
// or back to IEEE behaviour. The mode is per thread, and the intra-op threads a thread starts
// copy its mode when they are created, at its first parallel region (libgomp): call it in each
// executor thread before that thread runs anything. The inter-op pool (torch.jit.fork) is not
// covered. False where the CPU has no such mode.
bool SetFlushDenormals(bool on);
// True when libtorch was built with CUDA and sees at least one device.
bool CudaAvailable();

}  // namespace ferry::worker
