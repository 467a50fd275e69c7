// The worker's only libtorch translation unit for inference: loading, stacking with padding,
// device and dtype conversions (the dtype table: ferry/torch_dtype.h), the method call,
// splitting and trimming. Every c10::Error / std::exception is caught here as a Status.
#include "model.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "ferry/torch_dtype.h"
#include "ferry/worker/half_precision.h"

namespace ferry::worker {
namespace {

constexpr size_t kMaxErrorMessage = 1000;

// A model_error with `message`, at most kMaxErrorMessage bytes.
Status ModelError(std::string message) {
  if (message.size() > kMaxErrorMessage) message.resize(kMaxErrorMessage);
  return Status(codes::kModelError, std::move(message));
}

// A library exception's text as a job's model_error: its first meaningful line
// (SummarizeModelError). When that is not the whole text, the whole text goes to
// out->error_detail, for the worker's log.
Status LibraryError(std::string_view text, BatchOutput* out) {
  std::string first = SummarizeModelError(text);
  if (first.size() != text.size()) out->error_detail = std::string(text);
  return ModelError(std::move(first));
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

bool IsOutOfMemory(std::string_view message) {
  // CUDA's caching allocator, and cuBLAS/cuDNN running out of workspace.
  for (std::string_view needle :
       {"out of memory", "OutOfMemory", "ALLOC_FAILED", "NOT_ENOUGH_MEMORY"}) {
    if (message.find(needle) != std::string_view::npos) return true;
  }
  return false;
}

// The call (or moving the inputs) threw `text`. A smaller batch may succeed, so the caller
// retries in halves -- unless the model wrote into inputs it read in place (`wrote_inputs`):
// the halves would start from bytes it changed, so the batch fails as a whole, and says why.
Status CallFailed(std::string_view text, bool wrote_inputs, BatchOutput* out) {
  out->out_of_memory = IsOutOfMemory(text);
  if (out->out_of_memory) cuda::ReleaseCachedMemory();
  Status s = LibraryError(text, out);
  out->retry_smaller = !wrote_inputs;
  if (wrote_inputs) {
    s = ModelError(s.message().substr(0, kMaxErrorMessage - 80) +
                   " (the batch was not retried job by job: the model writes into its inputs)");
  }
  return s;
}

// Checks that every job has the first job's signature, up to the padded dimension.
Status CheckSignatures(const Padding& padding,
                       const std::vector<const std::vector<protocol::TensorRef>*>& inputs) {
  const auto& first = *inputs[0];
  for (const auto* job : inputs) {
    FERRY_RETURN_IF_ERROR(padding.Check(*job));
    bool same = job->size() == first.size();
    for (size_t k = 0; same && k < first.size(); ++k) {
      const auto& a = first[k];
      const auto& b = (*job)[k];
      same = a.dtype == b.dtype && a.shape.size() == b.shape.size();
      const int64_t padded = padding.IsPadded(k) ? padding.DimOf(a) : -1;
      for (size_t d = 0; same && d < a.shape.size(); ++d)
        same = static_cast<int64_t>(d) == padded || a.shape[d] == b.shape[d];
    }
    if (!same)
      return Status::InvalidArgument("Model::Run needs jobs with identical input signatures");
  }
  return Status::Ok();
}

// Whether input k of every job lies back to back in memory, aligned for its dtype, so that
// the bytes are the batch already: the input fetcher lays out the stored inputs of jobs fetched
// together so (input_fetcher.h). Checked per batch: the jobs of a batch may come from anywhere.
bool BackToBack(const std::vector<const std::vector<protocol::TensorRef>*>& inputs, size_t k) {
  const protocol::TensorRef& first = (*inputs[0])[k];
  if (first.size == 0 || reinterpret_cast<uintptr_t>(first.data) % ItemSize(first.dtype) != 0)
    return false;
  for (size_t j = 1; j < inputs.size(); ++j) {
    if ((*inputs[j])[k].data != first.data + j * first.size) return false;
  }
  return true;
}

}  // namespace

struct Model::Impl {
  struct Conversion {
    size_t input;
    c10::ScalarType to;
    double scale;
    at::Tensor mean;  // [C] on the device, undefined when none
    at::Tensor std;
    int64_t channel_dim;
  };
  explicit Impl(c10::Device d) : device(d) {}
  c10::Device device;
  torch::jit::Module module;
  std::vector<Conversion> conversions;
  // Whether a batch whose inputs lie back to back is read where it is (on the CPU); false
  // for good once the model is seen writing into such an input (WroteInputs).
  std::atomic<bool> read_in_place{true};
  // Whether the model is known to write into its inputs (WroteInputs, or Create was told).
  std::atomic<bool> writes_inputs{false};

  // Stacks input k of every job into one [B, ...] host tensor (pinned when the model is on
  // CUDA), padding to `target` when input k is padded, and moves it to the device. On the CPU,
  // with `keep_alive`, inputs that lie back to back are wrapped instead of copied (the tensor
  // holding `keep_alive`), and added to `in_place`.
  at::Tensor Stack(const Padding& padding, size_t k,
                   const std::vector<const std::vector<protocol::TensorRef>*>& inputs,
                   const std::vector<int64_t>& lengths, int64_t target,
                   const std::vector<std::shared_ptr<const void>>* keep_alive,
                   std::vector<at::Tensor>* in_place);
  // Whether the model wrote into one of the inputs it was given in place (their version
  // counters moved). Then it gets copies from now on (logged once): its next batches, and a
  // retry of this one, must not see bytes it changed.
  bool WroteInputs(const std::vector<at::Tensor>& in_place, const std::string& name);
  // Applies the dtype conversions, half precision and the lengths input.
  void Convert(bool half, std::vector<c10::IValue>* args) const;
};

at::Tensor Model::Impl::Stack(const Padding& padding, size_t k,
                              const std::vector<const std::vector<protocol::TensorRef>*>& inputs,
                              const std::vector<int64_t>& lengths, int64_t target,
                              const std::vector<std::shared_ptr<const void>>* keep_alive,
                              std::vector<at::Tensor>* in_place) {
  const protocol::TensorRef& first = (*inputs[0])[k];
  const int64_t batch = static_cast<int64_t>(inputs.size());
  c10::ScalarType st;
  if (!ToTorchDType(first.dtype, &st)) throw std::invalid_argument("unsupported input dtype");
  const bool pin = device.is_cuda();
  const auto options = at::TensorOptions().dtype(st).device(c10::kCPU).pinned_memory(pin);
  std::vector<int64_t> shape;
  shape.push_back(batch);
  shape.insert(shape.end(), first.shape.begin(), first.shape.end());
  const int64_t dim = padding.IsPadded(k) ? padding.DimOf(first) : -1;
  at::Tensor stacked;
  if (dim < 0 && !pin && keep_alive != nullptr && read_in_place.load(std::memory_order_relaxed) &&
      BackToBack(inputs, k)) {
    // The batch is there already: no copy (for 960 KB clips, ~120 us a job on a CPU). Its
    // storage holds the jobs' bytes alive (an output may be a view of it). A normal tensor, not
    // an inference one, so that its version counter shows writes (WroteInputs).
    c10::InferenceMode normal(false);
    stacked = at::from_blob(
        const_cast<char*>(first.data), shape, [hold = *keep_alive](void*) {},
        at::TensorOptions().dtype(st));
    in_place->push_back(stacked);
  } else if (dim < 0) {
    stacked = at::empty(shape, options);
    const size_t bytes = first.size;
    char* dst = bytes > 0 ? static_cast<char*>(stacked.data_ptr()) : nullptr;
    for (int64_t j = 0; j < batch && bytes > 0; ++j)
      std::memcpy(dst + j * bytes, (*inputs[j])[k].data, bytes);
  } else {
    shape[static_cast<size_t>(dim) + 1] = target;
    stacked = at::full(shape, padding.policy().value, options);
    for (int64_t j = 0; j < batch; ++j) {
      const protocol::TensorRef& t = (*inputs[j])[k];
      if (t.size == 0) continue;
      at::Tensor src =
          at::from_blob(const_cast<char*>(t.data), t.shape, at::TensorOptions().dtype(st));
      stacked.select(0, j).narrow(dim, 0, lengths[static_cast<size_t>(j)]).copy_(src);
    }
  }
  // From pinned memory the copy is asynchronous on the current stream; the caching host
  // allocator keeps the staging block until the copy is done.
  return pin ? stacked.to(device, st, /*non_blocking=*/true) : stacked;
}

bool Model::Impl::WroteInputs(const std::vector<at::Tensor>& in_place, const std::string& name) {
  for (const at::Tensor& t : in_place) {
    if (t._version() == 0) continue;
    writes_inputs.store(true);
    if (read_in_place.exchange(false)) {
      spdlog::warn("model {} writes into its inputs: its batches are copied from now on", name);
    }
    return true;
  }
  return false;
}

void Model::Impl::Convert(bool half, std::vector<c10::IValue>* args) const {
  for (const Conversion& c : conversions) {
    if (c.input >= args->size()) continue;
    at::Tensor x = (*args)[c.input].toTensor().to(c.to);
    if (c.scale != 1.0) x = x.mul(c.scale);
    if (c.mean.defined()) {
      std::vector<int64_t> view(static_cast<size_t>(x.dim()), 1);
      const int64_t cd = Padding::Normalize(c.channel_dim, static_cast<size_t>(x.dim() - 1));
      if (cd < 0) throw std::invalid_argument("convert: channel_dim out of range");
      view[static_cast<size_t>(cd) + 1] = c.mean.numel();
      x = x.sub(c.mean.to(x.scalar_type()).view(view)).div(c.std.to(x.scalar_type()).view(view));
    }
    (*args)[c.input] = x;
  }
  if (!half) return;
  for (c10::IValue& a : *args) {
    if (a.isTensor() && at::isFloatingType(a.toTensor().scalar_type()))
      a = a.toTensor().to(c10::kHalf);
  }
}

Model::Model(ModelConfig config, std::unique_ptr<Impl> impl)
    : config_(std::move(config)), padding_(config_.padding), impl_(std::move(impl)) {}

Model::~Model() = default;

Status Model::Create(std::string name, const std::string& path, const std::string& device,
                     std::unique_ptr<Model>* out) {
  ModelConfig config;
  config.name = std::move(name);
  config.path = path;
  config.device = device;
  return Create(config, out);
}

Status Model::Create(const ModelConfig& config, std::unique_ptr<Model>* out,
                     bool writes_into_inputs) {
  const std::string& device = config.device;
  if (device != "cpu" && device != "cuda" && device.rfind("cuda:", 0) != 0)
    return Status::InvalidArgument("device must be cpu, cuda or cuda:N, got \"" + device + "\"");
  const std::string what = "cannot load model \"" + config.name + "\" from " + config.path + ": ";
  try {
    c10::Device dev(device);
    int index = -1;
    if (dev.is_cuda()) {
      // Unavailable, not a bad flag: a driver still loading at boot looks the same, and the
      // worker exits 1 then, to be restarted (ferry-worker's main).
      if (!torch::cuda::is_available())
        return Status::Unavailable("device " + device + ": libtorch sees no CUDA device");
      if (dev.has_index() &&
          static_cast<int64_t>(dev.index()) >= static_cast<int64_t>(torch::cuda::device_count()))
        return Status::Unavailable("device " + device + " does not exist");
      index = dev.has_index() ? dev.index() : 0;
      // A bare "cuda" means device 0 here, as in the executor (libtorch would read it as "the
      // current device", which the executors' stream guards change).
      dev = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    } else if (config.half) {
      return Status::InvalidArgument("model \"" + config.name +
                                     "\": half precision needs a CUDA device");
    }
    const int64_t before = index >= 0 ? cuda::AllocatedBytes(index) : -1;
    auto impl = std::make_unique<Impl>(dev);
    impl->read_in_place = !config.copy_inputs && !writes_into_inputs;
    impl->writes_inputs = writes_into_inputs;
    impl->module = torch::jit::load(config.path, dev);
    if (config.half) ToHalfPrecision(&impl->module);
    impl->module.eval();
    if (!impl->module.find_method(config.method))
      return Status::InvalidArgument(what + "it has no method \"" + config.method + "\"");
    // Parameters, buffers and plain tensor attributes, each storage once (views, tied weights).
    // A frozen module (torch.jit.freeze) has none: its weights are constants of its code, so its
    // file's size stands for them, as Estimate does before the first load.
    int64_t params = 0;
    std::unordered_set<const void*> seen;
    for (const c10::IValue& v : impl->module.attributes(/*recurse=*/true)) {
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (!t.defined() || !t.has_storage()) continue;  // e.g. sparse: not counted
      if (seen.insert(t.storage().unsafeGetStorageImpl()).second)
        params += static_cast<int64_t>(t.storage().nbytes());
    }
    if (params == 0) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(config.path, ec);
      if (!ec) params = static_cast<int64_t>(size) / (config.half ? 2 : 1);
    }
    const int64_t after = index >= 0 ? cuda::AllocatedBytes(index) : -1;
    for (const InputConversion& c : config.convert) {
      Impl::Conversion conv{c.input, c10::kFloat, c.scale, {}, {}, c.channel_dim};
      if (!ToTorchDType(c.to, &conv.to)) return Status::InvalidArgument("bad convert dtype");
      if (!c.mean.empty()) {
        conv.mean = at::tensor(c.mean, at::TensorOptions().dtype(c10::kDouble)).to(dev);
        conv.std = at::tensor(c.std, at::TensorOptions().dtype(c10::kDouble)).to(dev);
      }
      impl->conversions.push_back(std::move(conv));
    }
    // The weights were loaded and converted on the default stream; executors run on their own
    // streams, which do not wait for it.
    if (index >= 0) torch::cuda::synchronize(index);
    out->reset(new Model(config, std::move(impl)));
    (*out)->parameter_bytes_ = params;
    (*out)->memory_bytes_ = before >= 0 && after >= 0 ? std::max(params, after - before) : params;
    return Status::Ok();
  } catch (const c10::Error& e) {
    return Status::Internal(what + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::Internal(what + e.what());
  }
}

bool Model::writes_into_inputs() const { return impl_->writes_inputs.load(); }

Status Model::Run(const std::vector<const std::vector<protocol::TensorRef>*>& inputs,
                  BatchOutput* out, const cuda::Stream* stream,
                  const std::vector<std::shared_ptr<const void>>* keep_alive) const {
  out->per_job.clear();
  out->owner.reset();
  out->retry_smaller = false;
  out->out_of_memory = false;
  out->error_detail.clear();
  const int64_t batch = static_cast<int64_t>(inputs.size());
  if (batch == 0) return Status::Ok();
  FERRY_RETURN_IF_ERROR(CheckSignatures(padding_, inputs));
  std::vector<int64_t> lengths(inputs.size());
  int64_t longest = 0;
  for (size_t j = 0; j < inputs.size(); ++j) {
    lengths[j] = padding_.Length(*inputs[j]);
    longest = std::max(longest, lengths[j]);
  }
  const int64_t target = padding_.Target(longest);

  auto tensors = std::make_shared<std::vector<at::Tensor>>();
  std::vector<at::Tensor>& outputs = *tensors;
  std::vector<at::Tensor> in_place;  // inputs read where they are (Impl::Stack)
  try {
    auto stream_guard = cuda::UseStream(stream);
    c10::InferenceMode inference_mode;
    at::NoGradGuard no_grad;
    std::vector<c10::IValue> args;
    args.reserve(inputs[0]->size() + 1);
    for (size_t k = 0; k < inputs[0]->size(); ++k)
      args.emplace_back(impl_->Stack(padding_, k, inputs, lengths, target, keep_alive, &in_place));
    impl_->Convert(config_.half, &args);
    if (padding_.policy().pass_lengths)
      args.emplace_back(
          at::tensor(lengths, at::TensorOptions().dtype(c10::kLong)).to(impl_->device));
    c10::IValue result = impl_->module.get_method(config_.method)(std::move(args));
    impl_->WroteInputs(in_place, config_.name);

    if (!CollectOutputs(result, &outputs)) {
      return ModelError(config_.method + " returned " + result.tagKind() +
                        "; expected a tensor or a tuple/list of tensors");
    }
    // Within what every decoder takes (protocol.md, "Tensors"): a result past it would be
    // stored `done` and then fail to decode in the producer's SDK.
    if (outputs.size() > protocol::kMaxInputsPerJob)
      return ModelError(config_.method + " returned " + std::to_string(outputs.size()) +
                        " tensors; a job's result holds at most " +
                        std::to_string(protocol::kMaxInputsPerJob));
    for (size_t k = 0; k < outputs.size(); ++k) {
      at::Tensor& t = outputs[k];
      DType dtype;
      if (t.layout() != c10::kStrided)
        return ModelError("output " + std::to_string(k) + " is a " + c10::str(t.layout()) +
                          " tensor; Ferry returns dense (strided) ones");
      if (t.dim() < 1 || t.size(0) != batch) {
        return ModelError("output " + std::to_string(k) + " has shape " + c10::str(t.sizes()) +
                          "; its first dimension must be the batch size " + std::to_string(batch));
      }
      if (t.dim() - 1 > static_cast<int64_t>(protocol::kMaxTensorDims))
        return ModelError("output " + std::to_string(k) + " has " + std::to_string(t.dim() - 1) +
                          " dims per job; at most " + std::to_string(protocol::kMaxTensorDims));
      for (int64_t d = 1; d < t.dim(); ++d)
        if (t.size(d) > (int64_t{1} << 40))
          return ModelError("output " + std::to_string(k) + " has shape " + c10::str(t.sizes()) +
                            "; a dimension is at most 2^40");
      if (config_.half && t.scalar_type() == c10::kHalf) t = t.to(c10::kFloat);
      if (!FromTorchDType(t.scalar_type(), &dtype)) {
        return ModelError("output " + std::to_string(k) + " has dtype " +
                          std::string(c10::toString(t.scalar_type())) +
                          ", which Ferry cannot encode");
      }
      t = t.to(c10::kCPU).contiguous();
    }
  } catch (const c10::Error& e) {
    return CallFailed(e.what_without_backtrace(), impl_->WroteInputs(in_place, config_.name), out);
  } catch (const std::exception& e) {
    return CallFailed(e.what(), impl_->WroteInputs(in_place, config_.name), out);
  }

  // Split: job j's slice of output k starts at j * (bytes per job) in the contiguous tensor;
  // outputs the policy trims are cut per job into tensors of their own.
  out->per_job.assign(static_cast<size_t>(batch), {});
  for (auto& job_outputs : out->per_job) job_outputs.resize(outputs.size());
  std::vector<const TrimRule*> trim(outputs.size(), nullptr);
  for (const TrimRule& rule : padding_.policy().trim) {
    if (rule.output >= outputs.size() ||
        Padding::Normalize(rule.dim, static_cast<size_t>(outputs[rule.output].dim() - 1)) < 0) {
      return ModelError("padding.trim names output " + std::to_string(rule.output) + " dim " +
                        std::to_string(rule.dim) + ", which the model does not return");
    }
    trim[rule.output] = &rule;
  }
  const size_t untrimmed = outputs.size();
  try {  // (slicing checked outputs does not throw; should libtorch, the job fails, not the batch)
    for (size_t k = 0; k < untrimmed; ++k) {
      protocol::TensorRef ref;
      FromTorchDType(outputs[k].scalar_type(), &ref.dtype);
      for (int64_t j = 0; j < batch; ++j) {
        at::Tensor slice;
        if (trim[k] != nullptr) {
          const at::Tensor row = outputs[k].select(0, j);
          const int64_t d = Padding::Normalize(trim[k]->dim, static_cast<size_t>(row.dim()));
          const int64_t keep = std::min(row.size(d), Padding::Trimmed(*trim[k], lengths[j]));
          outputs.push_back(row.narrow(d, 0, keep).contiguous());
          slice = outputs.back();
        } else {
          slice = outputs[k].select(0, j);  // contiguous: a view into row j
        }
        ref.shape.assign(slice.sizes().begin(), slice.sizes().end());
        ref.size = static_cast<size_t>(slice.numel()) * slice.element_size();
        ref.data = static_cast<const char*>(slice.data_ptr());
        out->per_job[static_cast<size_t>(j)][k] = ref;
      }
    }
  } catch (const c10::Error& e) {
    out->per_job.clear();
    return ModelError(SummarizeModelError(e.what_without_backtrace()));
  }
  out->owner = std::move(tensors);
  return Status::Ok();
}

std::string SummarizeModelError(std::string_view text) {
  auto trimmed = [](std::string_view line) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t'))
      line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    return line;
  };
  // The first non-empty line of `from`, skipping the interpreter's header lines.
  auto first_line = [&](std::string_view from) -> std::string_view {
    while (!from.empty()) {
      const size_t nl = from.find('\n');
      std::string_view line = trimmed(from.substr(0, nl));
      from = nl == std::string_view::npos ? std::string_view() : from.substr(nl + 1);
      if (line.empty() || line.rfind("The following operation failed", 0) == 0 ||
          line.rfind("Traceback of TorchScript", 0) == 0 ||
          line.rfind("Exception raised from", 0) == 0)
        continue;
      return line;
    }
    return {};
  };
  // The TorchScript interpreter's traceback marks the failing expression of each frame with
  // "<--- HERE", followed by indented source lines; the error itself is the first line after the
  // last mark that starts in the first column ("RuntimeError: mat1 and mat2 shapes ...").
  std::string_view line;
  if (size_t here = text.rfind("<--- HERE"); here != std::string_view::npos) {
    for (size_t nl = text.find('\n', here); nl != std::string_view::npos && line.empty();) {
      const size_t end = text.find('\n', nl + 1);
      std::string_view candidate = text.substr(
          nl + 1, end == std::string_view::npos ? std::string_view::npos : end - nl - 1);
      if (!candidate.empty() && candidate.front() != ' ' && candidate.front() != '\t')
        line = trimmed(candidate);
      nl = end;
    }
  }
  if (line.empty()) line = first_line(text);
  if (line.rfind("builtins.", 0) == 0) line.remove_prefix(9);  // raise in TorchScript
  if (line.empty()) return std::string(trimmed(text));
  return std::string(line);
}

void SetTorchThreads(int intra_op_threads) {
  if (intra_op_threads > 0 && at::get_num_threads() != intra_op_threads)
    at::set_num_threads(intra_op_threads);
}

bool SetFlushDenormals(bool on) {
  // The calling thread's MXCSR only. Its intra-op team copies it when the thread creates the
  // team (at its first parallel region): threads inherit their creator's floating-point mode.
  // (Setting an existing team from here would need an OpenMP region compiled into this file,
  // and libtorch wheels bring their own OpenMP runtime.)
  return at::globalContext().setFlushDenormal(on);
}

bool CudaAvailable() {
  try {
    return torch::cuda::is_available();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace ferry::worker
