#pragma once
// NumPy .npy files <-> ferry::Tensor, for the `ferry` CLI.
//
// Reads format versions 1.0, 2.0 and 3.0 with little-endian (or byte-order-free) dtypes:
// <f4 <f2 <f8 <i8 <i4 <i2 |i1 |u1 |b1, C order only. Anything else (big-endian, Fortran order,
// other dtypes, truncated data) is rejected with invalid_argument and a message saying why.
// Writes version 1.0 (2.0 when the header does not fit), header padded to 64 bytes.
// numpy has no bfloat16: bfloat16 tensors are written widened to float32 (exactly).

#include <string>
#include <string_view>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::cli {

// True when `bytes` starts with the .npy magic "\x93NUMPY".
bool LooksLikeNpy(std::string_view bytes);

// Parses a whole .npy file.
Status ParseNpy(std::string_view bytes, Tensor* out);

// Encodes `t` as a .npy file. Fails only for a tensor whose data does not match its shape.
Status EncodeNpy(const Tensor& t, std::string* out);

}  // namespace ferry::cli
