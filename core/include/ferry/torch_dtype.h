#pragma once
// The one table between Ferry's wire dtypes and libtorch's scalar types, for code that has
// libtorch (the worker's model.cc, <ferry/torch_convert.h>). Header-only; needs only c10's
// ScalarType header, not the whole of torch.

#include <c10/core/ScalarType.h>

#include "ferry/tensor.h"

namespace ferry {

namespace torch_dtype_internal {
struct Pair {
  DType dtype;
  c10::ScalarType scalar;
};
inline constexpr Pair kPairs[] = {
    {DType::kFloat32, c10::ScalarType::Float},     {DType::kFloat16, c10::ScalarType::Half},
    {DType::kBFloat16, c10::ScalarType::BFloat16}, {DType::kFloat64, c10::ScalarType::Double},
    {DType::kInt64, c10::ScalarType::Long},        {DType::kInt32, c10::ScalarType::Int},
    {DType::kInt16, c10::ScalarType::Short},       {DType::kInt8, c10::ScalarType::Char},
    {DType::kUInt8, c10::ScalarType::Byte},        {DType::kBool, c10::ScalarType::Bool},
};
}  // namespace torch_dtype_internal

// The torch scalar type of a Ferry dtype; false for none (cannot happen for a valid DType).
inline bool ToTorchDType(DType d, c10::ScalarType* out) {
  for (const auto& p : torch_dtype_internal::kPairs) {
    if (p.dtype == d) {
      *out = p.scalar;
      return true;
    }
  }
  return false;
}

// The Ferry dtype of a torch scalar type; false for types Ferry does not carry (complex, ...).
inline bool FromTorchDType(c10::ScalarType s, DType* out) {
  for (const auto& p : torch_dtype_internal::kPairs) {
    if (p.scalar == s) {
      *out = p.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace ferry
