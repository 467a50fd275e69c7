#include "padding.h"

#include <algorithm>
#include <cmath>

namespace ferry::worker {

int64_t Padding::Normalize(int64_t dim, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (dim < 0) dim += r;
  return dim >= 0 && dim < r ? dim : -1;
}

bool Padding::IsPadded(size_t k) const {
  return std::find(policy_.inputs.begin(), policy_.inputs.end(), k) != policy_.inputs.end();
}

Status Padding::Check(const std::vector<protocol::TensorRef>& inputs) const {
  if (!enabled()) return Status::Ok();
  int64_t length = -1;
  for (size_t k : policy_.inputs) {
    if (k >= inputs.size())
      return Status::InvalidArgument("the padding policy pads input " + std::to_string(k) +
                                     " but the job has " + std::to_string(inputs.size()));
    const int64_t dim = DimOf(inputs[k]);
    if (dim < 0)
      return Status::InvalidArgument(
          "input " + std::to_string(k) + " has " + std::to_string(inputs[k].shape.size()) +
          " dimension(s); the padding policy pads dimension " + std::to_string(policy_.dim));
    const int64_t n = inputs[k].shape[static_cast<size_t>(dim)];
    if (length >= 0 && n != length)
      return Status::InvalidArgument("padded inputs disagree on the length (" +
                                     std::to_string(length) + " vs " + std::to_string(n) + ")");
    length = n;
    // Checked at load when the config declares `inputs`; otherwise here, per job: cast to an
    // integer dtype, a value out of its range would pad with another number.
    std::string range;
    if (!ValueFits(inputs[k].dtype, policy_.value, &range))
      return Status::InvalidArgument("padding.value " + std::to_string(policy_.value) +
                                     " does not fit input " + std::to_string(k) + " (" +
                                     DTypeName(inputs[k].dtype) + "): want " + range);
  }
  return Status::Ok();
}

bool Padding::ValueFits(DType dtype, double value, std::string* range) {
  auto whole_in = [&](double lo, double hi, const char* text) {
    *range = text;
    return value == std::floor(value) && value >= lo && value <= hi;
  };
  switch (dtype) {
    case DType::kBool:
      return whole_in(0, 1, "0 or 1");
    case DType::kUInt8:
      return whole_in(0, 255, "a whole number 0..255");
    case DType::kInt8:
      return whole_in(-128, 127, "a whole number -128..127");
    case DType::kInt16:
      return whole_in(-32768, 32767, "a whole number -32768..32767");
    case DType::kInt32:
      return whole_in(-2147483648.0, 2147483647.0, "a whole number in int32");
    case DType::kInt64:
      return whole_in(-9.2e18, 9.2e18, "a whole number in int64");
    case DType::kFloat16:
      *range = "at most 65504 in magnitude, or an infinity";
      return std::isinf(value) || std::fabs(value) <= 65504.0;
    default:
      return true;
  }
}

int64_t Padding::Length(const std::vector<protocol::TensorRef>& inputs) const {
  if (!enabled() || policy_.inputs[0] >= inputs.size()) return 0;
  const auto& t = inputs[policy_.inputs[0]];
  const int64_t dim = DimOf(t);
  return dim < 0 ? 0 : t.shape[static_cast<size_t>(dim)];
}

int64_t Padding::Bucket(int64_t length) const {
  for (int64_t b : policy_.buckets)
    if (b >= length) return b;
  return length;  // no buckets, or longer than the last one
}

int64_t Padding::Trimmed(const TrimRule& rule, int64_t length) {
  return std::max<int64_t>(
      0, static_cast<int64_t>(std::ceil(static_cast<double>(length) * rule.ratio - 1e-9)));
}

std::string Padding::GroupKey(const std::vector<protocol::TensorRef>& inputs) const {
  const bool buckets = !policy_.buckets.empty();
  const int64_t length = enabled() ? Length(inputs) : 0;
  std::string key;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto& t = inputs[k];
    const int64_t padded_dim = enabled() && IsPadded(k) ? DimOf(t) : -1;
    key += std::to_string(static_cast<int>(t.dtype));
    key += '[';
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (static_cast<int64_t>(d) == padded_dim) {
        // Without buckets any length shares the batch; with buckets, jobs of one bucket do.
        key += buckets ? "b" + std::to_string(Bucket(length)) : std::string("*");
      } else {
        key += std::to_string(t.shape[d]);
      }
      key += ',';
    }
    key += ']';
  }
  return key;
}

}  // namespace ferry::worker
