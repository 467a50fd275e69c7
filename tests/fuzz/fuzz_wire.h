#pragma once
// Shared by the protocol targets of tests/fuzz: the comparisons and checks their round trips need.

#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/codec.h"
#include "ferry/tensor.h"
#include "fuzz_check.h"

namespace ferry::fuzz {

// The wire form of a decoded tensor (stored inputs: dtype, shape and size; no bytes; attached
// inputs: their bytes only when both were matched to a data frame).
inline bool SameTensor(const protocol::TensorRef& a, const protocol::TensorRef& b) {
  if (a.dtype != b.dtype || a.shape != b.shape || a.stored != b.stored ||
      a.attached != b.attached || a.size != b.size)
    return false;
  if (a.stored) return a.data == nullptr && b.data == nullptr;
  if (a.attached && (a.data == nullptr || b.data == nullptr)) return true;
  return a.size == 0 || std::string(a.data, a.size) == std::string(b.data, b.size);
}

inline bool SameTensors(const std::vector<protocol::TensorRef>& a,
                        const std::vector<protocol::TensorRef>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!SameTensor(a[i], b[i])) return false;
  return true;
}

// A decoded tensor's own invariants: its size is what dtype and shape need, and (when it has
// bytes) they lie inside the received buffer [begin, begin + size): decoding never copies.
inline void CheckTensor(const protocol::TensorRef& t, const char* begin, size_t size) {
  const int64_t numel = NumElements(t.shape);
  FUZZ_CHECK(numel >= 0);
  // numel * itemsize must not wrap around: a wrapped size would let a tiny "data" stand for a
  // huge shape.
  FUZZ_CHECK(static_cast<uint64_t>(numel) <= static_cast<uint64_t>(INT64_MAX) / ItemSize(t.dtype));
  FUZZ_CHECK(t.shape.size() <= protocol::kMaxTensorDims);
  FUZZ_CHECK(t.size == static_cast<uint64_t>(numel) * ItemSize(t.dtype));
  FUZZ_CHECK(!(t.stored && t.attached));
  if (t.stored || t.attached) {
    FUZZ_CHECK(t.data == nullptr);  // as decoded: an attached input's frame comes later
  } else if (t.size > 0) {
    FUZZ_CHECK(t.data >= begin && t.size <= size && t.data <= begin + (size - t.size));
  }
}

// Copies a decoded tensor (a stored one, or an attached one not matched to its frame, has no
// bytes: only its dtype and shape).
inline Tensor Owned(const protocol::TensorRef& t) {
  if (!t.stored && t.data != nullptr) return protocol::ToTensor(t);
  if (!t.stored && !t.attached) return protocol::ToTensor(t);
  Tensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  return out;
}

// The bytes of an encoded message body.
inline std::string Bytes(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}
inline std::string Bytes(const msgpack::sbuffer& b) { return std::string(b.data(), b.size()); }

// Unpacks msgpack bytes that must be one map: what an encoder just wrote.
inline msgpack::object_handle MustUnpack(const std::string& bytes) {
  msgpack::object_handle oh;
  FUZZ_CHECK_OK(protocol::UnpackMap(bytes.data(), bytes.size(), &oh));
  return oh;
}

}  // namespace ferry::fuzz
