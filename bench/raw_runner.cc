// The bench's only libtorch translation unit. c10::Error / std::exception become a Status here.
#include "raw_runner.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>
#include <torch/version.h>

#include <chrono>

#include "ferry/torch_convert.h"
#include "ferry/worker/half_precision.h"

namespace ferry::bench {
namespace {

void CollectOutputs(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) {
    out->push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) CollectOutputs(e, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) CollectOutputs(e, out);
  }
}

}  // namespace

bool RawAvailable() { return true; }

std::string TorchInfo() {
  return std::string("libtorch ") + TORCH_VERSION + "; " + at::get_parallel_info();
}

Status RunRaw(const RawOptions& o, std::vector<Sample>* samples, int64_t* jobs_done,
              double* seconds) {
  samples->clear();
  *jobs_done = 0;
  *seconds = 0;
  if (o.batch < 1) return Status::InvalidArgument("--batch must be >= 1");
  c10::ScalarType st;
  if (!ToTorchDType(o.dtype, &st)) return Status::InvalidArgument("unsupported dtype");
  try {
    if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
    c10::Device device(o.device);
    if (o.half && !device.is_cuda())
      return Status::InvalidArgument("--half needs a CUDA --device (as the worker's half = true)");
    torch::jit::Module module = torch::jit::load(o.path, device);
    if (o.half) worker::ToHalfPrecision(&module);
    module.eval();
    torch::manual_seed(o.seed);
    std::vector<int64_t> shape{o.batch};
    shape.insert(shape.end(), o.shape.begin(), o.shape.end());
    at::Tensor input = at::isFloatingType(st)
                           ? at::randn(shape).to(st)
                           : at::randint(0, st == c10::kBool ? 2 : 100, shape).to(st);
    c10::InferenceMode inference_mode;
    // One step = what a worker does for one batch: input to the device, forward, outputs back
    // to the CPU and contiguous (which also waits for a GPU to finish).
    auto step = [&] {
      // --half as the worker's half = true: floating inputs cast on the device, float16
      // outputs back to float32 there.
      at::Tensor on_device = input.to(device);
      if (o.half && on_device.is_floating_point()) on_device = on_device.to(c10::kHalf);
      std::vector<c10::IValue> args{on_device};
      c10::IValue result = module.forward(std::move(args));
      std::vector<at::Tensor> outputs;
      CollectOutputs(result, &outputs);
      for (auto& t : outputs) {
        if (o.half && t.scalar_type() == c10::kHalf) t = t.to(c10::kFloat);
        t = t.to(c10::kCPU).contiguous();
      }
    };
    for (int64_t done = 0; done < o.warmup; done += o.batch) step();
    const int64_t steps = (o.jobs + o.batch - 1) / o.batch;
    samples->reserve(static_cast<size_t>(steps));
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      step();
      Sample s;
      s.latency_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      s.batch_size = o.batch;
      samples->push_back(s);
    }
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    *jobs_done = steps * o.batch;
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Status::Internal(std::string("raw run: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::Internal(std::string("raw run: ") + e.what());
  }
}

}  // namespace ferry::bench
