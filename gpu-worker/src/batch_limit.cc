#include "batch_limit.h"

#include <algorithm>

namespace ferry::worker {

BatchLimit::BatchLimit(int64_t max_batch, int64_t hold_us, int64_t step_us)
    : max_(std::max<int64_t>(1, max_batch)),
      hold_us_(std::max<int64_t>(0, hold_us)),
      step_us_(std::max<int64_t>(1, step_us)) {}

int64_t BatchLimit::Current(int64_t now_us) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (lowered_ == 0) return max_;
  const int64_t since = now_us - lowered_at_;
  if (since < hold_us_) return lowered_;
  int64_t limit = lowered_;
  for (int64_t steps = (since - hold_us_) / step_us_ + 1; steps > 0 && limit < max_; --steps)
    limit *= 2;
  return std::min(limit, max_);
}

int64_t BatchLimit::LowerTo(int64_t limit, int64_t now_us) {
  const int64_t current = Current(now_us);
  std::lock_guard<std::mutex> lock(mu_);
  lowered_ = std::min(current, std::max<int64_t>(1, limit));
  lowered_at_ = now_us;
  return lowered_;
}

}  // namespace ferry::worker
