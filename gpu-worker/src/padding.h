#pragma once
// Padding: the shape arithmetic of a model's PaddingPolicy, shared by the Batcher (which groups
// jobs) and Model::Run (which pads and trims). Torch-free, so it is unit-tested on its own.
//
// A job's "length" is the size of the padded dimension of the first padded input; every other
// padded input must have the same length. Jobs go in one batch when their GroupKey()s are equal:
// same input count, dtypes and shapes, except that padded dimensions compare by Bucket().
// Thread-safety: immutable after construction.

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"
#include "ferry/worker/model_config.h"

namespace ferry::worker {

class Padding {
 public:
  Padding() = default;  // no policy: every dimension must match
  explicit Padding(PaddingPolicy policy) : policy_(std::move(policy)) {}

  bool enabled() const { return policy_.enabled(); }
  const PaddingPolicy& policy() const { return policy_; }

  // kInvalidArgument when a padded input is missing, has too few dimensions, has a dtype the
  // pad value does not fit (ValueFits), or the padded inputs disagree on the length. Always OK
  // without a policy.
  Status Check(const std::vector<protocol::TensorRef>& inputs) const;
  // The job's true length (after Check); 0 without a policy.
  int64_t Length(const std::vector<protocol::TensorRef>& inputs) const;
  // Whether input `k` is padded, and along which dimension of it (after Check).
  bool IsPadded(size_t k) const;
  int64_t DimOf(const protocol::TensorRef& t) const {
    return Normalize(policy_.dim, t.shape.size());
  }
  // The length a job is padded to when alone: its bucket, or its own length.
  int64_t Bucket(int64_t length) const;
  // The length a batch whose longest job is `longest` is padded to.
  int64_t Target(int64_t longest) const { return Bucket(longest); }
  // ceil(length * rule.ratio), at least 0.
  static int64_t Trimmed(const TrimRule& rule, int64_t length);
  // Equal for two jobs exactly when they may share a batch.
  std::string GroupKey(const std::vector<protocol::TensorRef>& inputs) const;

  // Whether `value` pads an input of `dtype` as it is: an integer dtype takes whole numbers in
  // its range, bool 0 or 1, float16 at most 65504 in magnitude (or an infinity); *range says
  // what.
  static bool ValueFits(DType dtype, double value, std::string* range);
  // `dim` for a tensor of `rank` dims (negative counts from the end); -1 when out of range.
  static int64_t Normalize(int64_t dim, size_t rank);

 private:
  PaddingPolicy policy_;
};

}  // namespace ferry::worker
