#include "ferry/metrics/metric.h"

#include <algorithm>
#include <cmath>

namespace ferry::metrics {
namespace {

void AtomicAdd(std::atomic<double>* a, double v) {
  double old = a->load(std::memory_order_relaxed);
  while (!a->compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

}  // namespace

void Counter::Add(double amount) {
  if (!(amount > 0)) return;  // also drops NaN
  AtomicAdd(&fractions_, amount);
}

double Counter::Value() const {
  return static_cast<double>(ints_.load(std::memory_order_relaxed)) +
         fractions_.load(std::memory_order_relaxed);
}

void Gauge::Inc(double amount) { AtomicAdd(&value_, amount); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: bucket "le" semantics.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ferry::metrics
