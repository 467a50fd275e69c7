#pragma once
// Counter, Gauge and Histogram: one time series each (a metric name plus one set of label
// values). A Registry (registry.h) makes and owns them; callers keep the raw pointer, which stays
// valid for the Registry's lifetime (unless the series is Remove()d).
//
// Thread-safety: every method may be called from any number of threads at once. Updates are
// lock-free relaxed atomics: a counter or gauge update is one atomic add (or a short
// compare-exchange loop for doubles); a histogram observation is a binary search over its bucket
// bounds plus two atomic adds. Cheap enough for a hot path; no allocation, no lock.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace ferry::metrics {

// A monotonically increasing total (Prometheus "counter"). Name it ..._total.
class Counter {
 public:
  void Inc() { ints_.fetch_add(1, std::memory_order_relaxed); }
  void Inc(uint64_t n) { ints_.fetch_add(n, std::memory_order_relaxed); }
  // Adds a non-integral amount (e.g. busy seconds). Negative or NaN amounts are ignored: a
  // counter never goes down.
  void Add(double amount);
  double Value() const;

 private:
  std::atomic<uint64_t> ints_{0};
  std::atomic<double> fractions_{0.0};
};

// A value that goes up and down (Prometheus "gauge"): queue depth, credit, bytes in use.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Inc(double amount = 1.0);
  void Dec(double amount = 1.0) { Inc(-amount); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted in fixed buckets (Prometheus "histogram"): latencies in seconds, batch
// sizes. Bucket i counts observations v <= upper_bounds[i]; an implicit +Inf bucket takes the
// rest. NaN observations are ignored.
class Histogram {
 public:
  // `upper_bounds` must be finite and strictly increasing (the Registry checks).
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;  // finite bounds; the +Inf bucket is implied
    std::vector<uint64_t> cumulative;  // size upper_bounds.size() + 1; the last is the count
    uint64_t count = 0;
    double sum = 0.0;
  };
  // A consistent-enough copy for exposition: count is the sum of the buckets read.
  Snapshot Read() const;
  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

}  // namespace ferry::metrics
