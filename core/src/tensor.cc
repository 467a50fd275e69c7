#include "ferry/tensor.h"

namespace ferry {
namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4},   {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat64, "float64", 8},
    {DType::kInt64, "int64", 8},       {DType::kInt32, "int32", 4},
    {DType::kInt16, "int16", 2},       {DType::kInt8, "int8", 1},
    {DType::kUInt8, "uint8", 1},       {DType::kBool, "bool", 1},
};
}  // namespace

const char* DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }
size_t ItemSize(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }

bool ParseDType(std::string_view name, DType* out) {
  for (const auto& info : kDTypes) {
    if (name == info.name) {
      *out = info.dtype;
      return true;
    }
  }
  return false;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  // At most 2^59 elements, so that numel * ItemSize (at most 8) never wraps: with 2^62, a
  // [2^31, 2^31] float64 tensor needed "0 bytes" (found by tests/fuzz/fuzz_tensor).
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kMaxElements / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace ferry
