#pragma once
// RunRaw: the limit a fleet is measured against -- the same TorchScript model run in-process
// in a tight loop at a fixed batch size, with the same thread budget as a worker. Mirrors what
// a worker does per batch (input to the device, forward under InferenceMode, outputs back to
// the CPU) without Ferry around it. Only this file pair touches libtorch (raw_stub.cc stands in
// when the build has no libtorch).
//
// Thread-safety: call from one thread at a time (it sets libtorch's global thread count).

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"
#include "report.h"

namespace ferry::bench {

struct RawOptions {
  std::string path;            // TorchScript file
  std::string device = "cpu";  // cpu, cuda, cuda:N
  int64_t batch = 1;           // jobs per forward
  std::vector<int64_t> shape;  // one job's input shape (without the batch dim)
  DType dtype = DType::kFloat32;
  int64_t jobs = 1000;  // forwards = ceil(jobs / batch)
  int64_t warmup = 0;   // jobs run first and not measured
  int64_t threads = 0;  // at::set_num_threads; 0 leaves libtorch's default
  int64_t seed = 1;
  bool half = false;  // as the model repository's `half = true` (CUDA)
};

// Whether this build can run RunRaw (false without libtorch).
bool RawAvailable();

// One Sample per forward (latency_ms: that forward including the copies, batch_size: batch);
// *jobs_done = forwards x batch; *seconds = the measured loop's wall time.
Status RunRaw(const RawOptions& options, std::vector<Sample>* samples, int64_t* jobs_done,
              double* seconds);

// libtorch's version and its parallel/BLAS configuration, for the report ("" without libtorch).
std::string TorchInfo();

}  // namespace ferry::bench
