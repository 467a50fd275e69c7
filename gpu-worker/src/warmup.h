#pragma once
// WarmUp: runs a freshly loaded model on batches of zeros -- `iterations` times for each
// warmup batch size (default: 1 and max_batch) and, for a model with padding buckets, for each
// bucket -- so that cudnn autotuning, the caching allocator and the TorchScript profiling
// executor settle before the model is announced as resident. The batches go through
// Model::Run, so conversions, padding and trimming are exercised too.
// Torch-free. Thread-safety: as Model::Run.

#include <cstdint>

#include "cuda_support.h"
#include "ferry/status.h"
#include "model.h"

namespace ferry::worker {

// OK at once when config.warmup has no inputs. Fails with the first failing batch's Status.
Status WarmUp(const Model& model, int64_t max_batch, const cuda::Stream* stream,
              int64_t* batches_run = nullptr);

}  // namespace ferry::worker
