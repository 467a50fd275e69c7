#pragma once
// What `ferry status` and `ferry top` show: the broker's STATS (Client::Stats JSON) as tables,
// and, for `top`, rates over the refresh interval from two STATS samples plus, optionally, two
// scrapes of the broker's and workers' /metrics (latency percentiles, busy %, batches/s, ages).
// Pure functions of their inputs, so the tests can feed them canned data.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ferry/metrics/text_format.h"
#include "ferry/status.h"

namespace ferry::cli {

struct WorkerRow {
  std::string id, device, host;
  int64_t pid = 0, capacity = 0, credit = 0, in_flight = 0, last_seen_ms = 0;
  std::vector<std::string> models;
};

// One input spec of a model (STATS "models") and the workers that announced it.
struct ModelSpecGroup {
  bool declared = false;  // false: these workers declared no spec (any inputs are accepted)
  std::string inputs;     // e.g. "mel: float32 [-1, 80], 1: int64 []" (-1: any size)
  std::vector<std::string> workers;  // sorted; empty: no worker serves it now, still checked
};

struct FleetStats {
  std::map<std::string, std::vector<ModelSpecGroup>> models;  // model -> its specs
  std::vector<WorkerRow> workers;                             // sorted by id
  std::map<std::string, int64_t> queues;                      // model -> queued jobs
  int64_t pending = 0;
  std::map<std::string, int64_t> counters;  // accepted, rejected, finished, requeued, ...
};

// Reads the STATS JSON (docs/protocol.md). Fails with malformed when it is not that shape.
Status ParseFleetStats(const std::string& json, FleetStats* out);

// One-shot tables: workers, queues, counters. `endpoint` is shown in the title.
std::string FormatStatus(const FleetStats& stats, const std::string& endpoint);

// `ferry models`: one row per model and input spec -- MODEL, INPUTS, WORKERS.
std::string FormatModels(const FleetStats& stats, const std::string& endpoint);

// One scrape of one /metrics endpoint.
struct Scrape {
  std::string url;
  bool ok = false;
  std::string error;
  metrics::ParsedText parsed;
};

// What the scrapes say about one interval (NaN where unknown).
struct IntervalMetrics {
  double p50_s, p99_s;                          // end-to-end latency, all models
  std::map<std::string, double> busy_percent;   // worker -> executor busy %
  std::map<std::string, double> batches_per_s;  // worker -> batches/s
  std::map<std::string, double> oldest_age_s;   // model -> oldest queued job age (now)
  std::vector<std::string> errors;              // scrape failures, for a footer
  IntervalMetrics();
};
IntervalMetrics ComputeIntervalMetrics(const std::vector<Scrape>& before,
                                       const std::vector<Scrape>& after, double seconds);

// One `top` frame: rates from the counter deltas between `before` and `after`.
std::string FormatTop(const FleetStats& before, const FleetStats& after, double seconds,
                      const IntervalMetrics& metrics, const std::string& endpoint);

}  // namespace ferry::cli
