#pragma once
// Runs a TorchScript model in-process, one job at a time: the reference every fleet result
// is compared with. Torch stays inside reference.cc.

#include <string>
#include <vector>

#include "ferry/tensor.h"

namespace ferry::testutil {

// model(inputs with a batch dim of 1) -> outputs without the batch dim. Throws on failure.
std::vector<Tensor> RunReference(const std::string& model_path, const std::vector<Tensor>& inputs);

// Max |a - b| over float32 tensors of equal shape; +inf when shapes/dtypes differ.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

// A float32 tensor of the given shape with values from a seeded generator.
Tensor RandomFloats(const std::vector<int64_t>& shape, uint32_t seed);

}  // namespace ferry::testutil
