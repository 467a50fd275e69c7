#pragma once
// Registry: the set of metric families one process exposes, and their Prometheus text form.
//
//   ferry::metrics::Registry registry;                        // one per process
//   Counter* accepted = registry.Counter(names::kJobsAccepted, names::kJobsAcceptedHelp,
//                                        {{"model", "tiny"}});
//   accepted->Inc();                                          // hot path: one atomic add
//   std::string text = registry.Expose();                     // what GET /metrics serves
//
// Counter/Gauge/Histogram return the series for (name, labels), creating it the first time;
// calling again with the same name and labels (in any order) returns the same pointer, so a
// caller may look series up once and cache them, or look them up each time (a mutex-guarded map
// lookup) where the label values vary (per model, per status code).
//
// Misuse never crashes and never returns null: an invalid metric or label name, a name already
// registered with another type (or a histogram with other buckets), a duplicate label name or a
// histogram label named "le" gets a detached series that works but is not exposed, and
// registration_errors() counts it (last_error() says why). Tests assert it stays 0.
//
// Thread-safety: all methods may be called concurrently from any thread. Pointers returned stay
// valid until the Registry is destroyed, or Remove() drops that series.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/metrics/metric.h"

namespace ferry::metrics {

// Label name/value pairs, e.g. {{"model", "tiny"}, {"status", "done"}}. Order does not matter.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  metrics::Counter* Counter(const std::string& name, const std::string& help,
                            const Labels& labels = {});
  metrics::Gauge* Gauge(const std::string& name, const std::string& help,
                        const Labels& labels = {});
  // `upper_bounds`: finite, strictly increasing (e.g. names::LatencyBuckets()). Every series of
  // one family must use the same bounds.
  metrics::Histogram* Histogram(const std::string& name, const std::string& help,
                                const std::vector<double>& upper_bounds, const Labels& labels = {});

  // Drops one series (e.g. the gauges of a worker that left) so it is no longer exposed.
  // Returns false when there is no such series. The caller must not use its pointer afterwards.
  bool Remove(const std::string& name, const Labels& labels);

  // The Prometheus text exposition format, version 0.0.4: families sorted by name, each with
  // # HELP and # TYPE lines, series sorted by their labels. Families with no series are left out.
  std::string Expose() const;

  uint64_t registration_errors() const;
  std::string last_error() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    Labels labels;  // sorted by label name
    std::unique_ptr<metrics::Counter> counter;
    std::unique_ptr<metrics::Gauge> gauge;
    std::unique_ptr<metrics::Histogram> histogram;
  };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> upper_bounds;
    std::map<std::string, Series> series;  // keyed by the canonical label text
  };
  // Finds or creates the series; null (after recording the error) when the request is invalid.
  Series* FindOrCreate(const std::string& name, const std::string& help, Type type,
                       const std::vector<double>& upper_bounds, const Labels& labels);
  void RecordError(std::string message);  // needs mu_ held
  static void ExposeFamily(const std::string& name, const Family& family, std::string* out);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  // Detached series handed out on misuse; kept so their pointers stay valid.
  std::vector<std::unique_ptr<Series>> detached_;
  uint64_t errors_ = 0;
  std::string last_error_;
};

// Valid Prometheus names: metric [a-zA-Z_:][a-zA-Z0-9_:]*, label [a-zA-Z_][a-zA-Z0-9_]*
// (labels starting with "__" are reserved).
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

}  // namespace ferry::metrics
