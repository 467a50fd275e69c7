#include "ferry/metrics/registry.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ferry/metrics/names.h"
#include "ferry/metrics/text_format.h"

namespace ferry::metrics {
namespace {

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// {a="x",b="y"} from sorted labels (plus an optional extra pair, e.g. le), or "" when empty.
std::string LabelText(const Labels& labels, const char* extra_name = nullptr,
                      const std::string& extra_value = "") {
  if (labels.empty() && !extra_name) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += EscapeLabelValue(v);
    out += '"';
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (extra_name) add(extra_name, extra_value);
  out += '}';
  return out;
}

const char* TypeName(int type) {
  static const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

}  // namespace

bool IsValidMetricName(const std::string& name) {
  if (name.empty() || !(IsAlpha(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return IsAlpha(c) || IsDigit(c) || c == ':'; });
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty() || !IsAlpha(name[0]) || name.rfind("__", 0) == 0) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsAlpha(c) || IsDigit(c); });
}

metrics::Counter* Registry::Counter(const std::string& name, const std::string& help,
                                    const Labels& labels) {
  return FindOrCreate(name, help, Type::kCounter, {}, labels)->counter.get();
}

metrics::Gauge* Registry::Gauge(const std::string& name, const std::string& help,
                                const Labels& labels) {
  return FindOrCreate(name, help, Type::kGauge, {}, labels)->gauge.get();
}

metrics::Histogram* Registry::Histogram(const std::string& name, const std::string& help,
                                        const std::vector<double>& upper_bounds,
                                        const Labels& labels) {
  return FindOrCreate(name, help, Type::kHistogram, upper_bounds, labels)->histogram.get();
}

void Registry::RecordError(std::string message) {
  ++errors_;
  last_error_ = std::move(message);
}

Registry::Series* Registry::FindOrCreate(const std::string& name, const std::string& help,
                                         Type type, const std::vector<double>& upper_bounds,
                                         const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  std::string key = LabelText(sorted);

  std::lock_guard<std::mutex> lock(mu_);
  std::string error;
  if (!IsValidMetricName(name)) error = "invalid metric name \"" + name + "\"";
  for (size_t i = 0; error.empty() && i < sorted.size(); ++i) {
    const std::string& l = sorted[i].first;
    if (!IsValidLabelName(l))
      error = "invalid label name \"" + l + "\" on " + name;
    else if (i > 0 && sorted[i - 1].first == l)
      error = "label \"" + l + "\" twice on " + name;
    else if (type == Type::kHistogram && l == "le")
      error = "histogram " + name + " has label le";
  }
  if (error.empty() && type == Type::kHistogram) {
    bool ok = !upper_bounds.empty();
    for (size_t i = 0; ok && i < upper_bounds.size(); ++i)
      ok = std::isfinite(upper_bounds[i]) && (i == 0 || upper_bounds[i] > upper_bounds[i - 1]);
    if (!ok) error = "histogram " + name + ": bounds must be finite and strictly increasing";
  }
  Family* family = nullptr;
  if (error.empty()) {
    auto it = families_.find(name);
    if (it == families_.end()) {
      it = families_.emplace(name, Family{type, help, upper_bounds, {}}).first;
    } else if (it->second.type != type) {
      error = name + " is already a " + TypeName(static_cast<int>(it->second.type));
    } else if (type == Type::kHistogram && it->second.upper_bounds != upper_bounds) {
      error = "histogram " + name + " registered with other buckets";
    }
    family = &it->second;
  }

  Series fresh;
  fresh.labels = sorted;
  switch (type) {
    case Type::kCounter:
      fresh.counter = std::make_unique<metrics::Counter>();
      break;
    case Type::kGauge:
      fresh.gauge = std::make_unique<metrics::Gauge>();
      break;
    case Type::kHistogram: {
      std::vector<double> bounds = upper_bounds;
      if (!error.empty()) bounds.clear();  // a detached histogram: everything in +Inf
      fresh.histogram = std::make_unique<metrics::Histogram>(bounds);
      break;
    }
  }
  if (!error.empty()) {
    RecordError(std::move(error));
    detached_.push_back(std::make_unique<Series>(std::move(fresh)));
    return detached_.back().get();
  }
  auto [it, inserted] = family->series.try_emplace(key);
  if (inserted) it->second = std::move(fresh);
  return &it->second;
}

bool Registry::Remove(const std::string& name, const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return false;
  return it->second.series.erase(LabelText(sorted)) > 0;
}

uint64_t Registry::registration_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

std::string Registry::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void Registry::ExposeFamily(const std::string& name, const Family& family, std::string* out) {
  if (family.series.empty()) return;
  *out += "# HELP " + name + " " + EscapeHelp(family.help) + "\n";
  *out += "# TYPE " + name + " " + TypeName(static_cast<int>(family.type)) + "\n";
  for (const auto& [key, s] : family.series) {
    switch (family.type) {
      case Type::kCounter:
        *out += name + key + " " + FormatValue(s.counter->Value()) + "\n";
        break;
      case Type::kGauge:
        *out += name + key + " " + FormatValue(s.gauge->Value()) + "\n";
        break;
      case Type::kHistogram: {
        Histogram::Snapshot snap = s.histogram->Read();
        for (size_t i = 0; i <= snap.upper_bounds.size(); ++i) {
          std::string le =
              i < snap.upper_bounds.size() ? FormatValue(snap.upper_bounds[i]) : "+Inf";
          *out += name + "_bucket" + LabelText(s.labels, "le", le) + " " +
                  FormatValue(static_cast<double>(snap.cumulative[i])) + "\n";
        }
        *out += name + "_sum" + key + " " + FormatValue(snap.sum) + "\n";
        *out += name + "_count" + key + " " + FormatValue(static_cast<double>(snap.count)) + "\n";
        break;
      }
    }
  }
}

std::string Registry::Expose() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, family] : families_) ExposeFamily(name, family, &out);
  return out;
}

// ---- names.h ----------------------------------------------------------------------------------

namespace names {

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
  return kBuckets;
}

const std::vector<double>& BatchSizeBuckets() {
  static const std::vector<double> kBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  return kBuckets;
}

void RegisterProcessInfo(Registry* registry, const std::string& component,
                         const std::string& version) {
  registry
      ->Gauge(kBuildInfo, kBuildInfoHelp, {{kLabelComponent, component}, {kLabelVersion, version}})
      ->Set(1);
  double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  registry->Gauge(kProcessStartTime, kProcessStartTimeHelp)->Set(std::floor(now));
}

}  // namespace names
}  // namespace ferry::metrics
