#include "ferry/protocol/input_check.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::protocol {
namespace {

std::string Describe(DType dtype, const std::vector<int64_t>& shape) {
  std::string out = std::string(DTypeName(dtype)) + " [";
  for (size_t d = 0; d < shape.size(); ++d)
    out += (d ? ", " : "") + (shape[d] < 0 ? std::string("-1") : std::to_string(shape[d]));
  return out + "]";
}

std::string InputName(size_t k, const InputSpec& spec) {
  return "input " + std::to_string(k) + (spec.name.empty() ? "" : " (\"" + spec.name + "\")");
}

bool Matches(const std::vector<InputSpec>& spec, const std::vector<TensorRef>& inputs) {
  if (spec.size() != inputs.size()) return false;
  for (size_t k = 0; k < spec.size(); ++k) {
    const auto& want = spec[k];
    const auto& got = inputs[k];
    if (want.dtype != got.dtype || want.shape.size() != got.shape.size()) return false;
    for (size_t d = 0; d < want.shape.size(); ++d)
      if (want.shape[d] >= 0 && want.shape[d] != got.shape[d]) return false;
  }
  return true;
}

// Why `inputs` do not match `spec` (which they do not).
std::string Mismatch(const std::string& model, const std::vector<InputSpec>& spec,
                     const std::vector<TensorRef>& inputs) {
  const std::string head = "model \"" + model + "\" ";
  if (spec.size() != inputs.size()) {
    std::string list;
    for (size_t k = 0; k < spec.size(); ++k)
      list +=
          (k ? ", " : "") + InputName(k, spec[k]) + ": " + Describe(spec[k].dtype, spec[k].shape);
    return head + "takes " + std::to_string(spec.size()) + " input(s) (" + list + "), got " +
           std::to_string(inputs.size());
  }
  for (size_t k = 0; k < spec.size(); ++k) {
    if (Matches({spec[k]}, {inputs[k]})) continue;
    return head + InputName(k, spec[k]) + ": expected " + Describe(spec[k].dtype, spec[k].shape) +
           ", got " + Describe(inputs[k].dtype, inputs[k].shape);
  }
  return head + "inputs do not match";  // not reached
}

}  // namespace

Status CheckInputs(const std::string& model, const std::vector<std::vector<InputSpec>>& specs,
                   const std::vector<TensorRef>& inputs) {
  for (const auto& spec : specs)
    if (Matches(spec, inputs)) return Status::Ok();
  if (specs.empty()) return Status::Ok();
  std::string message = Mismatch(model, specs.front(), inputs);
  if (specs.size() > 1)
    message += " (its workers announce " + std::to_string(specs.size()) +
               " different input specs; the job matches none: see `ferry models`)";
  return Status::InvalidArgument(std::move(message));
}

Status CheckInputs(const std::string& model, const std::vector<InputSpec>& spec,
                   const std::vector<TensorRef>& inputs) {
  if (Matches(spec, inputs)) return Status::Ok();
  return Status::InvalidArgument(Mismatch(model, spec, inputs));
}

}  // namespace ferry::protocol
