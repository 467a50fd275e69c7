#pragma once
// Optional, header-only: converts between ferry::Tensor and torch::Tensor for producers that
// use libtorch. Include it only where <torch/torch.h> is available (it is not compiled into
// ferry::client, which never needs libtorch); link your target with ${TORCH_LIBRARIES}.
//
//   torch::Tensor x = torch::rand({3, 224, 224});
//   ferry::Tensor in;
//   ferry::Status s = ferry::FromTorch(x, &in);          // copies; any device, any strides
//   ...
//   torch::Tensor y;
//   s = ferry::ToTorch(result.outputs[0], &y);           // copies into a new CPU tensor
//
// Both directions copy the data (a ferry::Tensor owns its bytes), support the ten wire dtypes
// (float32 float16 bfloat16 float64 int64 int32 int16 int8 uint8 bool) and report problems as a
// Status (invalid_argument) instead of throwing. Thread-safety: plain functions on values.

#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"
#include "ferry/torch_dtype.h"

namespace ferry {

// Copies `in` into a new contiguous CPU torch::Tensor. invalid_argument when the data size
// does not match dtype and shape.
inline Status ToTorch(const Tensor& in, torch::Tensor* out) {
  c10::ScalarType st = torch::kFloat32;
  if (!ToTorchDType(in.dtype, &st)) return Status::InvalidArgument("unknown ferry dtype");
  int64_t numel = in.numel();
  if (numel < 0 || in.data.size() != static_cast<uint64_t>(numel) * ItemSize(in.dtype))
    return Status::InvalidArgument("tensor data does not match its dtype and shape");
  try {
    torch::Tensor t = torch::empty(in.shape, torch::TensorOptions().dtype(st));
    if (!in.data.empty()) std::memcpy(t.data_ptr(), in.data.data(), in.data.size());
    *out = std::move(t);
  } catch (const c10::Error& e) {
    return Status::InvalidArgument(std::string("ToTorch: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

// Copies `in` (any device, any strides) into *out. invalid_argument for undefined tensors and
// dtypes Ferry does not carry (complex, uint16, ...).
inline Status FromTorch(const torch::Tensor& in, Tensor* out) {
  if (!in.defined()) return Status::InvalidArgument("FromTorch: undefined tensor");
  DType dtype = DType::kFloat32;
  if (!FromTorchDType(in.scalar_type(), &dtype)) {
    return Status::InvalidArgument(std::string("FromTorch: unsupported dtype ") +
                                   c10::toString(in.scalar_type()));
  }
  try {
    torch::Tensor cpu = in.detach().to(torch::kCPU).contiguous();
    out->dtype = dtype;
    out->shape.assign(cpu.sizes().begin(), cpu.sizes().end());
    out->data.assign(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  } catch (const c10::Error& e) {
    return Status::InvalidArgument(std::string("FromTorch: ") + e.what_without_backtrace());
  }
  return Status::Ok();
}

}  // namespace ferry
