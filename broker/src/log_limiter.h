#pragma once
// LogLimiter: keeps one kind of warning from flooding the log when a peer repeats a bad message
// (one warning per bad frame was 86k lines a minute under fuzzing). At most `burst` lines per
// `period`; the first line after a quiet spell says how many were suppressed meanwhile.
//
// Thread-safety: none (the broker's thread).

#include <cstdint>

namespace ferry::broker {

class LogLimiter {
 public:
  explicit LogLimiter(int burst = 10, int64_t period_us = 10'000'000)
      : burst_(burst), period_us_(period_us) {}

  // True when this occurrence may be logged; then *suppressed is how many were not logged since
  // the last one that was.
  bool Allow(int64_t now_us, int64_t* suppressed) {
    if (now_us - window_start_us_ >= period_us_) {
      window_start_us_ = now_us;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++in_window_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  int burst_;
  int64_t period_us_;
  int64_t window_start_us_ = INT64_MIN / 2;
  int in_window_ = 0;
  int64_t suppressed_ = 0;
};

}  // namespace ferry::broker
