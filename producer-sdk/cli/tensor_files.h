#pragma once
// Reading input tensors from files and writing output tensors, for the `ferry` CLI.

#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::cli {

// Parses "1,8" (also "1x8", "[1, 8]"); "" and "()" give a scalar (no dimensions).
Status ParseShape(std::string_view text, std::vector<int64_t>* out);

// Reads `path` as one tensor: a .npy file (recognised by its magic, whatever its name), or raw
// little-endian C-order bytes of `dtype` with `shape` ("" = one dimension covering the file).
Status ReadTensorFile(const std::string& path, const std::string& dtype, const std::string& shape,
                      Tensor* out);

Status ReadFile(const std::string& path, std::string* out);
Status WriteFile(const std::string& path, std::string_view data);

}  // namespace ferry::cli
