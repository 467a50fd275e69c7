#pragma once
// BatchLimit: a model's effective max batch, lowered when the device runs out of memory and
// restored gradually. Lowered to L (never raised by it: LowerTo), it stays there for `hold_us`;
// then it doubles every `step_us` until it is back at the configured maximum. Another OOM while
// lowered lowers it again and restarts the hold.
//
// Thread-safety: every method may be called from any thread (one mutex). Times are monotonic
// microseconds passed in by the caller, so tests need no sleeps.

#include <cstdint>
#include <mutex>

namespace ferry::worker {

class BatchLimit {
 public:
  static constexpr int64_t kDefaultHoldUs = 60 * 1000 * 1000;
  static constexpr int64_t kDefaultStepUs = 10 * 1000 * 1000;

  explicit BatchLimit(int64_t max_batch, int64_t hold_us = kDefaultHoldUs,
                      int64_t step_us = kDefaultStepUs);

  // The limit at time `now_us`.
  int64_t Current(int64_t now_us) const;
  // Lowers the limit to `limit` (at least 1; never raised by it) at `now_us`. Returns the new
  // limit.
  int64_t LowerTo(int64_t limit, int64_t now_us);
  int64_t max() const { return max_; }

 private:
  const int64_t max_;
  const int64_t hold_us_;
  const int64_t step_us_;
  mutable std::mutex mu_;
  int64_t lowered_ = 0;  // 0: not lowered
  int64_t lowered_at_ = 0;
};

}  // namespace ferry::worker
