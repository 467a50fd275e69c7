#pragma once
// A job's inputs against a model's declared input specs (docs/models.md, `inputs`): checked by
// the broker at SUBMIT against what its workers announce, and by a worker against its own
// config before a batch (a job the broker let through -- no spec known to it yet, or another
// worker's spec in a rolling upgrade -- then fails alone instead of running on wrong data).

#include <string>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::protocol {

// OK when `inputs` match one of `specs` (or `specs` is empty); otherwise kInvalidArgument with
// a message about the first spec: the count, or the first input that differs ("model \"m\"
// input 0 (\"x\"): expected float32 [-1, 80], got float16 [100, 80]"). Per input: a dtype
// compare and a shape compare; no allocation unless it fails.
Status CheckInputs(const std::string& model, const std::vector<std::vector<InputSpec>>& specs,
                   const std::vector<TensorRef>& inputs);
// The same against one spec (a worker's own config).
Status CheckInputs(const std::string& model, const std::vector<InputSpec>& spec,
                   const std::vector<TensorRef>& inputs);

}  // namespace ferry::protocol
