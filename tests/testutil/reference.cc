#include "reference.h"

#include <torch/script.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>

namespace ferry::testutil {
namespace {

torch::ScalarType ToTorch(DType d) {
  switch (d) {
    case DType::kFloat32: return torch::kFloat32;
    case DType::kFloat16: return torch::kFloat16;
    case DType::kBFloat16: return torch::kBFloat16;
    case DType::kFloat64: return torch::kFloat64;
    case DType::kInt64: return torch::kInt64;
    case DType::kInt32: return torch::kInt32;
    case DType::kInt16: return torch::kInt16;
    case DType::kInt8: return torch::kInt8;
    case DType::kUInt8: return torch::kUInt8;
    case DType::kBool: return torch::kBool;
  }
  return torch::kFloat32;
}

DType FromTorch(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat16: return DType::kFloat16;
    case torch::kBFloat16: return DType::kBFloat16;
    case torch::kFloat64: return DType::kFloat64;
    case torch::kInt64: return DType::kInt64;
    case torch::kInt32: return DType::kInt32;
    case torch::kInt16: return DType::kInt16;
    case torch::kInt8: return DType::kInt8;
    case torch::kUInt8: return DType::kUInt8;
    case torch::kBool: return DType::kBool;
    default: return DType::kFloat32;
  }
}

Tensor FromTorchTensor(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous().cpu();
  Tensor out;
  out.dtype = FromTorch(c.scalar_type());
  out.shape.assign(c.sizes().begin() + 1, c.sizes().end());
  out.data.assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

}  // namespace

std::vector<Tensor> RunReference(const std::string& model_path, const std::vector<Tensor>& inputs) {
  static std::mutex mu;
  static std::map<std::string, torch::jit::Module> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(model_path);
  if (it == cache.end()) {
    auto m = torch::jit::load(model_path);
    m.eval();
    it = cache.emplace(model_path, std::move(m)).first;
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::jit::IValue> args;
  for (const auto& in : inputs) {
    std::vector<int64_t> shape = {1};
    shape.insert(shape.end(), in.shape.begin(), in.shape.end());
    auto t = torch::empty(shape, torch::TensorOptions().dtype(ToTorch(in.dtype)));
    std::memcpy(t.data_ptr(), in.data.data(), in.data.size());
    args.emplace_back(t);
  }
  auto out = it->second.forward(args);
  std::vector<Tensor> result;
  if (out.isTensor()) {
    result.push_back(FromTorchTensor(out.toTensor()));
  } else if (out.isTuple()) {
    for (const auto& e : out.toTuple()->elements()) result.push_back(FromTorchTensor(e.toTensor()));
  } else if (out.isList()) {
    for (const auto& e : out.toList()) result.push_back(FromTorchTensor(e.get().toTensor()));
  }
  return result;
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype || a.shape != b.shape || a.data.size() != b.data.size())
    return std::numeric_limits<double>::infinity();
  if (a.dtype != DType::kFloat32) return a.data == b.data ? 0.0 : 1.0;
  auto x = a.As<float>(), y = b.As<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - double(y[i])));
  return m;
}

Tensor RandomFloats(const std::vector<int64_t>& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(NumElements(shape));
  for (auto& x : v) x = dist(rng);
  return Tensor::From(v, shape, DType::kFloat32);
}

}  // namespace ferry::testutil
