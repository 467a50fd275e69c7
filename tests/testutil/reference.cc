#include "reference.h"

#include <torch/script.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>

#include "ferry/torch_convert.h"

namespace ferry::testutil {
namespace {

// A model output (with its batch dimension of 1) as a job's result tensor (without it).
Tensor Unbatched(const torch::Tensor& t) {
  Tensor out;
  Status s = FromTorch(t, &out);
  if (!s.ok()) throw std::runtime_error("reference output: " + s.ToString());
  out.shape.erase(out.shape.begin());
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
    torch::Tensor t;
    Status s = ToTorch(in, &t);
    if (!s.ok()) throw std::runtime_error("reference input: " + s.ToString());
    args.emplace_back(t.unsqueeze(0));
  }
  auto out = it->second.forward(args);
  std::vector<Tensor> result;
  if (out.isTensor()) {
    result.push_back(Unbatched(out.toTensor()));
  } else if (out.isTuple()) {
    for (const auto& e : out.toTuple()->elements()) result.push_back(Unbatched(e.toTensor()));
  } else if (out.isList()) {
    for (const auto& e : out.toList()) result.push_back(Unbatched(e.get().toTensor()));
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
