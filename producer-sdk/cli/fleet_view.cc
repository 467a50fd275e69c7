#include "fleet_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "ferry/metrics/names.h"
#include "json.h"

namespace ferry::cli {
namespace {

namespace names = metrics::names;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Left-aligned columns, two spaces apart.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const {
    std::vector<size_t> width;
    for (const auto& r : rows_) {
      if (width.size() < r.size()) width.resize(r.size(), 0);
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      std::string line;
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Ago(int64_t ms) {
  if (ms < 1000) return std::to_string(ms) + "ms ago";
  if (ms < 120000) return Fixed(ms / 1000.0, 1) + "s ago";
  return std::to_string(ms / 60000) + "m ago";
}

std::string Millis(double seconds) {
  if (std::isnan(seconds)) return "-";
  return Fixed(seconds * 1000, seconds < 0.01 ? 2 : 1) + " ms";
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "-" : out;
}

int64_t Counter(const FleetStats& s, const std::string& name) {
  auto it = s.counters.find(name);
  return it == s.counters.end() ? 0 : it->second;
}

const char* kCounterOrder[] = {"accepted", "rejected", "finished",
                               "requeued", "chunks",   "dispatched"};

// The worker name a scrape describes (ferry_worker_info{worker=...}), or "" for the broker.
std::string WorkerOf(const Scrape& s) {
  for (const auto& sample : s.parsed.samples) {
    if (sample.name != names::kWorkerInfo) continue;
    auto it = sample.labels.find(names::kLabelWorker);
    if (it != sample.labels.end()) return it->second;
  }
  return "";
}

// A JSON number as a count: NaN is 0, and the value is clamped to +-2^53 (a double's exact
// integers), so that a hostile or broken STATS reply (1e400, -inf) never makes the cast or the
// differences `ferry top` takes between two replies overflow.
int64_t Count(const JsonValue& v) {
  constexpr double kLimit = 9007199254740992.0;  // 2^53
  const double d = v.NumberOr(0);
  if (std::isnan(d)) return 0;
  return static_cast<int64_t>(std::clamp(d, -kLimit, kLimit));
}

const Scrape* FindByUrl(const std::vector<Scrape>& v, const std::string& url) {
  for (const auto& s : v)
    if (s.url == url && s.ok) return &s;
  return nullptr;
}

// What a terminal gets of a string from the network: control characters become '?'.
std::string Shown(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

// STATS "inputs" [{"name"?, "dtype", "shape"}] as "name: dtype [d, ...]" (or "K: ..." unnamed).
std::string DescribeInputs(const JsonValue& inputs) {
  std::string out;
  for (size_t k = 0; k < inputs.array.size(); ++k) {
    const JsonValue& in = inputs.array[k];
    std::string shape;
    for (const JsonValue& d : in["shape"].array)
      shape += (shape.empty() ? "" : ", ") + std::to_string(Count(d));
    const std::string name = in["name"].StringOr("");
    out += (k ? ", " : "") + (name.empty() ? std::to_string(k) : Shown(name)) + ": " +
           Shown(in["dtype"].StringOr("?")) + " [" + shape + "]";
  }
  return out.empty() ? "(no inputs)" : out;
}

}  // namespace

IntervalMetrics::IntervalMetrics() : p50_s(kNaN), p99_s(kNaN) {}

Status ParseFleetStats(const std::string& json, FleetStats* out) {
  *out = FleetStats();
  JsonValue root;
  if (Status s = ParseJson(json, &root); !s.ok()) return s;
  if (root.type != JsonValue::Type::kObject)
    return Status("malformed", "STATS is not a JSON object");
  for (const JsonValue& w : root["workers"].array) {
    WorkerRow r;
    r.id = w["id"].StringOr("?");
    r.device = w["device"].StringOr("?");
    r.host = w["host"].StringOr("?");
    r.pid = Count(w["pid"]);
    r.capacity = Count(w["capacity"]);
    r.credit = Count(w["credit"]);
    r.in_flight = Count(w["in_flight"]);
    r.last_seen_ms = Count(w["last_seen_ms"]);
    for (const JsonValue& m : w["models"].array) r.models.push_back(m.StringOr("?"));
    out->workers.push_back(std::move(r));
  }
  std::sort(out->workers.begin(), out->workers.end(),
            [](const WorkerRow& a, const WorkerRow& b) { return a.id < b.id; });
  for (const auto& [model, entry] : root["models"].object) {
    auto& groups = out->models[Shown(model)];
    for (const JsonValue& g : entry["specs"].array) {
      ModelSpecGroup group;
      group.declared = g["inputs"].type == JsonValue::Type::kArray;
      if (group.declared) group.inputs = DescribeInputs(g["inputs"]);
      for (const JsonValue& w : g["workers"].array) group.workers.push_back(Shown(w.StringOr("?")));
      std::sort(group.workers.begin(), group.workers.end());
      groups.push_back(std::move(group));
    }
  }
  for (const auto& [model, depth] : root["queues"].object) out->queues[model] = Count(depth);
  out->pending = Count(root["pending"]);
  for (const auto& [name, value] : root["counters"].object) out->counters[name] = Count(value);
  return Status::Ok();
}

std::string FormatStatus(const FleetStats& s, const std::string& endpoint) {
  std::string out = "broker " + endpoint + ": " + std::to_string(s.workers.size()) +
                    " worker(s), " + std::to_string(s.pending) + " job(s) pending\n\n";
  Table workers({"WORKER", "DEVICE", "HOST", "PID", "MODELS", "CREDIT", "IN-FLIGHT", "CAPACITY",
                 "LAST-SEEN"});
  for (const auto& w : s.workers)
    workers.Add({w.id, w.device, w.host, std::to_string(w.pid), Join(w.models),
                 std::to_string(w.credit), std::to_string(w.in_flight), std::to_string(w.capacity),
                 Ago(w.last_seen_ms)});
  out += s.workers.empty() ? "no workers connected\n" : workers.Render();
  out += "\n";
  Table queues({"QUEUE", "DEPTH"});
  for (const auto& [model, depth] : s.queues) queues.Add({model, std::to_string(depth)});
  out += s.queues.empty() ? "no queues (no model announced yet)\n" : queues.Render();
  out += "\ncounters:";
  for (const char* c : kCounterOrder)
    out += std::string("  ") + c + " " + std::to_string(Counter(s, c));
  for (const auto& [name, value] : s.counters) {  // any the broker added since
    if (std::find(std::begin(kCounterOrder), std::end(kCounterOrder), name) ==
        std::end(kCounterOrder))
      out += "  " + name + " " + std::to_string(value);
  }
  return out + "\n";
}

std::string FormatModels(const FleetStats& s, const std::string& endpoint) {
  std::string out = "broker " + endpoint + ": " + std::to_string(s.models.size()) + " model(s)\n\n";
  if (s.models.empty()) return out + "no model announced yet\n";
  Table table({"MODEL", "INPUTS", "WORKERS"});
  for (const auto& [model, groups] : s.models) {
    if (groups.empty()) table.Add({model, "(not declared: any inputs)", "(none now)"});
    for (const auto& g : groups)
      table.Add({model, g.declared ? g.inputs : "(not declared: any inputs)",
                 g.workers.empty() ? "(none now; still checked)" : Join(g.workers)});
  }
  out += table.Render();
  bool several = false;
  for (const auto& [model, groups] : s.models) several |= groups.size() > 1;
  if (several)
    out +=
        "\nA model listed with several specs is served by workers that disagree (a rolling\n"
        "upgrade): the broker accepts jobs that match any of its declared specs, and any\n"
        "job when one of its workers declares none.\n";
  return out;
}

IntervalMetrics ComputeIntervalMetrics(const std::vector<Scrape>& before,
                                       const std::vector<Scrape>& after, double seconds) {
  IntervalMetrics m;
  std::map<double, double> latency_delta;
  for (const Scrape& a : after) {
    if (!a.ok) {
      m.errors.push_back(a.url + ": " + a.error);
      continue;
    }
    for (const auto& sample : a.parsed.samples) {
      if (sample.name != names::kQueueOldestAge) continue;
      auto model = sample.labels.find(names::kLabelModel);
      if (model != sample.labels.end()) m.oldest_age_s[model->second] = sample.value;
    }
    const Scrape* b = FindByUrl(before, a.url);
    if (!b || seconds <= 0) continue;
    auto now = metrics::HistogramBuckets(a.parsed, names::kJobLatency);
    auto then = metrics::HistogramBuckets(b->parsed, names::kJobLatency);
    for (const auto& [le, n] : now) latency_delta[le] += n - then[le];
    std::string worker = WorkerOf(a);
    if (worker.empty()) continue;
    double executors = metrics::SumSamples(a.parsed, names::kExecutors);
    double busy = metrics::SumSamples(a.parsed, names::kExecutorBusy) -
                  metrics::SumSamples(b->parsed, names::kExecutorBusy);
    if (executors > 0) m.busy_percent[worker] = 100.0 * busy / (seconds * executors);
    m.batches_per_s[worker] = (metrics::SumSamples(a.parsed, names::kBatches) -
                               metrics::SumSamples(b->parsed, names::kBatches)) /
                              seconds;
  }
  m.p50_s = metrics::HistogramQuantile(0.5, latency_delta);
  m.p99_s = metrics::HistogramQuantile(0.99, latency_delta);
  return m;
}

std::string FormatTop(const FleetStats& before, const FleetStats& after, double seconds,
                      const IntervalMetrics& m, const std::string& endpoint) {
  auto rate = [&](const char* counter) {
    if (seconds <= 0) return kNaN;
    return std::max<double>(0, Counter(after, counter) - Counter(before, counter)) / seconds;
  };
  std::string out = "ferry top  broker " + endpoint + "  interval " + Fixed(seconds, 2) +
                    " s  workers " + std::to_string(after.workers.size()) + "  pending " +
                    std::to_string(after.pending) + "\n";
  out += "throughput  finished " + Fixed(rate("finished"), 1) + "/s  accepted " +
         Fixed(rate("accepted"), 1) + "/s  rejected " + Fixed(rate("rejected"), 1) +
         "/s  dispatched " + Fixed(rate("dispatched"), 1) + "/s  chunks " +
         Fixed(rate("chunks"), 1) + "/s  requeued " + Fixed(rate("requeued"), 1) + "/s\n";
  out += "latency     p50 " + Millis(m.p50_s) + "  p99 " + Millis(m.p99_s) +
         "  (end to end, over the interval" +
         (std::isnan(m.p50_s) ? std::string("; needs --metrics BROKER_URL") : "") + ")\n\n";

  Table workers(
      {"WORKER", "DEVICE", "MODELS", "CREDIT", "IN-FLIGHT", "BUSY%", "BATCHES/S", "LAST-SEEN"});
  for (const auto& w : after.workers) {
    auto busy = m.busy_percent.find(w.id);
    auto batches = m.batches_per_s.find(w.id);
    workers.Add(
        {w.id, w.device, Join(w.models), std::to_string(w.credit), std::to_string(w.in_flight),
         busy == m.busy_percent.end() ? "-" : Fixed(busy->second, 0),
         batches == m.batches_per_s.end() ? "-" : Fixed(batches->second, 1), Ago(w.last_seen_ms)});
  }
  out += after.workers.empty() ? "no workers connected\n" : workers.Render();
  out += "\n";
  Table queues({"QUEUE", "DEPTH", "CHANGE", "OLDEST"});
  for (const auto& [model, depth] : after.queues) {
    auto prev = before.queues.find(model);
    int64_t change = depth - (prev == before.queues.end() ? 0 : prev->second);
    auto age = m.oldest_age_s.find(model);
    queues.Add({model, std::to_string(depth), (change > 0 ? "+" : "") + std::to_string(change),
                age == m.oldest_age_s.end() ? "-" : Fixed(age->second, 2) + " s"});
  }
  out += after.queues.empty() ? "no queues\n" : queues.Render();
  for (const auto& e : m.errors) out += "metrics: " + e + "\n";
  return out;
}

}  // namespace ferry::cli
