#pragma once
// ferry::Tensor: Ferry's own small tensor type -- a dtype, a shape and the raw bytes
// (little-endian, C-contiguous), exactly as it travels on the wire (docs/protocol.md, "Tensors").
// Users with libtorch convert with <ferry/torch_convert.h>; everyone else fills it by hand.
//
// Thread-safety: a plain value. Public header: includes only the standard library.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
};

// The wire name of a dtype ("float32", ...).
const char* DTypeName(DType dtype);
// Parses a wire name; false when `name` is not one of the ten dtypes.
bool ParseDType(std::string_view name, DType* out);
// Bytes per element.
size_t ItemSize(DType dtype);
// Product of the dims; -1 when a dim is negative or the product is over kMaxElements, so that
// NumElements(shape) * ItemSize(dtype) always fits in an int64.
inline constexpr int64_t kMaxElements = int64_t{1} << 59;
int64_t NumElements(const std::vector<int64_t>& shape);

struct Tensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // without the batch dimension, in a job's inputs/outputs
  std::string data;            // NumElements(shape) * ItemSize(dtype) bytes

  // Builds a tensor from a typed vector: Tensor::From<float>({1, 2, 3}, {3}).
  template <typename T>
  static Tensor From(const std::vector<T>& values, std::vector<int64_t> shape, DType dtype) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    return t;
  }
  // Copies the bytes out as T (caller picks T matching dtype).
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out(data.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
    return out;
  }
  int64_t numel() const { return NumElements(shape); }
};

}  // namespace ferry
