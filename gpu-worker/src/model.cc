// The worker's only libtorch translation unit: loading, dtype mapping, stacking, forward and
// splitting. Every c10::Error / std::exception is caught here and turned into a Status.
#include "ferry/worker/model.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cstring>
#include <string_view>
#include <utility>

namespace ferry::worker {
namespace {

constexpr size_t kMaxErrorMessage = 1000;

bool ToScalarType(DType d, c10::ScalarType* out) {
  switch (d) {
    case DType::kFloat32: *out = c10::kFloat; return true;
    case DType::kFloat16: *out = c10::kHalf; return true;
    case DType::kBFloat16: *out = c10::kBFloat16; return true;
    case DType::kFloat64: *out = c10::kDouble; return true;
    case DType::kInt64: *out = c10::kLong; return true;
    case DType::kInt32: *out = c10::kInt; return true;
    case DType::kInt16: *out = c10::kShort; return true;
    case DType::kInt8: *out = c10::kChar; return true;
    case DType::kUInt8: *out = c10::kByte; return true;
    case DType::kBool: *out = c10::kBool; return true;
  }
  return false;
}

bool FromScalarType(c10::ScalarType s, DType* out) {
  switch (s) {
    case c10::kFloat: *out = DType::kFloat32; return true;
    case c10::kHalf: *out = DType::kFloat16; return true;
    case c10::kBFloat16: *out = DType::kBFloat16; return true;
    case c10::kDouble: *out = DType::kFloat64; return true;
    case c10::kLong: *out = DType::kInt64; return true;
    case c10::kInt: *out = DType::kInt32; return true;
    case c10::kShort: *out = DType::kInt16; return true;
    case c10::kChar: *out = DType::kInt8; return true;
    case c10::kByte: *out = DType::kUInt8; return true;
    case c10::kBool: *out = DType::kBool; return true;
    default: return false;
  }
}

// The library's message, at most kMaxErrorMessage bytes. An error raised inside the
// TorchScript interpreter comes as a long traceback that ends with the actual error
// ("RuntimeError: mat1 and mat2 shapes cannot be multiplied ..."): that line goes first.
Status ModelError(std::string message) {
  constexpr std::string_view kMarker = "<--- HERE\n";
  if (size_t here = message.rfind(kMarker); here != std::string::npos) {
    std::string error = message.substr(here + kMarker.size());
    while (!error.empty() && (error.back() == '\n' || error.back() == ' ')) error.pop_back();
    if (!error.empty()) message = error + "\n" + message.substr(0, here + kMarker.size());
  }
  if (message.size() > kMaxErrorMessage) message.resize(kMaxErrorMessage);
  return Status(codes::kModelError, std::move(message));
}

bool SameSignature(const std::vector<protocol::TensorRef>& a,
                   const std::vector<protocol::TensorRef>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].dtype != b[k].dtype || a[k].shape != b[k].shape) return false;
  }
  return true;
}

// Flattens forward's return value into tensors; false when it is not a tensor or a
// tuple/list of tensors.
bool CollectOutputs(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) {
    out->push_back(v.toTensor());
    return true;
  }
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (!e.isTensor()) return false;
      out->push_back(e.toTensor());
    }
    return true;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isTensor()) return false;
      out->push_back(e.toTensor());
    }
    return true;
  }
  return false;
}

}  // namespace

struct Model::Impl {
  explicit Impl(c10::Device d) : device(d) {}
  c10::Device device;
  torch::jit::Module module;
};

Model::Model(std::string name, std::string device, std::unique_ptr<Impl> impl)
    : name_(std::move(name)), device_(std::move(device)), impl_(std::move(impl)) {}

Model::~Model() = default;

Status Model::Create(std::string name, const std::string& path, const std::string& device,
                     std::unique_ptr<Model>* out) {
  if (device != "cpu" && device != "cuda" && device.rfind("cuda:", 0) != 0)
    return Status::InvalidArgument("device must be cpu, cuda or cuda:N, got \"" + device + "\"");
  try {
    c10::Device dev(device);
    if (dev.is_cuda()) {
      if (!torch::cuda::is_available())
        return Status::InvalidArgument("device " + device + ": libtorch sees no CUDA device");
      if (dev.has_index() && static_cast<size_t>(dev.index()) >= torch::cuda::device_count())
        return Status::InvalidArgument("device " + device + " does not exist");
    }
    auto impl = std::make_unique<Impl>(dev);
    impl->module = torch::jit::load(path, dev);
    impl->module.eval();
    out->reset(new Model(std::move(name), device, std::move(impl)));
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Status::Internal("cannot load model \"" + name + "\" from " + path + ": " +
                            e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::Internal("cannot load model \"" + name + "\" from " + path + ": " + e.what());
  }
}

Status Model::Run(const std::vector<const std::vector<protocol::TensorRef>*>& inputs,
                  BatchOutput* out) const {
  out->per_job.clear();
  out->owner.reset();
  out->retry_smaller = false;
  const int64_t batch = static_cast<int64_t>(inputs.size());
  if (batch == 0) return Status::Ok();
  const std::vector<protocol::TensorRef>& first = *inputs[0];
  for (const auto* job : inputs) {
    if (!SameSignature(first, *job))
      return Status::InvalidArgument("Model::Run needs jobs with identical input signatures");
  }

  std::vector<at::Tensor> outputs;
  try {
    c10::InferenceMode inference_mode;
    at::NoGradGuard no_grad;
    // Stack: one allocation per input position, one memcpy per job.
    std::vector<c10::IValue> args;
    args.reserve(first.size());
    for (size_t k = 0; k < first.size(); ++k) {
      c10::ScalarType st;
      if (!ToScalarType(first[k].dtype, &st))
        return Status::InvalidArgument("unsupported input dtype");
      std::vector<int64_t> shape;
      shape.reserve(first[k].shape.size() + 1);
      shape.push_back(batch);
      shape.insert(shape.end(), first[k].shape.begin(), first[k].shape.end());
      at::Tensor stacked = at::empty(shape, at::TensorOptions().dtype(st).device(c10::kCPU));
      const size_t bytes = first[k].size;
      if (bytes > 0) {
        char* dst = static_cast<char*>(stacked.data_ptr());
        for (int64_t j = 0; j < batch; ++j)
          std::memcpy(dst + j * bytes, (*inputs[j])[k].data, bytes);
      }
      args.emplace_back(stacked.to(impl_->device));
    }
    c10::IValue result = impl_->module.forward(std::move(args));

    if (!CollectOutputs(result, &outputs)) {
      return ModelError("forward returned " + result.tagKind() +
                        "; expected a tensor or a tuple/list of tensors");
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      at::Tensor& t = outputs[k];
      DType dtype;
      if (t.dim() < 1 || t.size(0) != batch) {
        return ModelError("output " + std::to_string(k) + " has shape " +
                          c10::str(t.sizes()) + "; its first dimension must be the batch size " +
                          std::to_string(batch));
      }
      if (!FromScalarType(t.scalar_type(), &dtype)) {
        return ModelError("output " + std::to_string(k) + " has dtype " +
                          std::string(c10::toString(t.scalar_type())) +
                          ", which Ferry cannot encode");
      }
      t = t.to(c10::kCPU).contiguous();
    }
  } catch (const c10::Error& e) {
    out->retry_smaller = true;
    return ModelError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    out->retry_smaller = true;
    return ModelError(e.what());
  }

  // Split: job j's slice of output k starts at j * (bytes per job) in the contiguous tensor.
  out->per_job.assign(static_cast<size_t>(batch), {});
  for (auto& job_outputs : out->per_job) job_outputs.resize(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& t = outputs[k];
    protocol::TensorRef ref;
    FromScalarType(t.scalar_type(), &ref.dtype);
    ref.shape.assign(t.sizes().begin() + 1, t.sizes().end());
    ref.size = static_cast<size_t>(t.numel() / batch) * t.element_size();
    const char* base = static_cast<const char*>(t.data_ptr());
    for (int64_t j = 0; j < batch; ++j) {
      ref.data = ref.size > 0 ? base + j * ref.size : base;
      out->per_job[static_cast<size_t>(j)][k] = ref;
    }
  }
  out->owner = std::make_shared<std::vector<at::Tensor>>(std::move(outputs));
  return Status::Ok();
}

void SetTorchThreads(int intra_op_threads) {
  if (intra_op_threads > 0) at::set_num_threads(intra_op_threads);
}

bool CudaAvailable() {
  try {
    return torch::cuda::is_available();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace ferry::worker
