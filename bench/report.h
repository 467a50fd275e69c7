#pragma once
// Samples and the summary ferry-bench prints and writes as JSON. No libtorch, no SDK internals.
//
// Thread-safety: plain values and free functions; JsonObject is not shared between threads.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ferry::bench {

// One measured job (fleet modes) or one forward call (raw mode).
struct Sample {
  double latency_ms = 0;  // fleet: intended start -> result readable; raw: one forward of a batch
  int64_t batch_size = 0;
  // Fleet only, microseconds, from the result's `timing` and the bench's wall clock:
  //   submit   bench start of the job  -> broker accepted it (`submitted`)
  //   queue    `submitted`             -> `dispatched`
  //   dispatch `dispatched`            -> `compute_start` (network, worker queue, stacking),
  //            in two parts: transfer `dispatched` -> `received` (the broker's send, the
  //            network, the worker's BrokerLink) and worker `received` -> `compute_start` (the
  //            executor's queue and stacking)
  //   compute  `compute_start`         -> `compute_end`
  //   delivery `compute_end`           -> Wait()/Run() returned (split, encode, the Redis
  //                                       write, then the worker's notice -- or DONE, FINISHED
  //                                       and an MGET -- and decode)
  // Stamps from different hosts compare different clocks: submit and transfer then mean little.
  double submit_us = 0, queue_us = 0, dispatch_us = 0, compute_us = 0, delivery_us = 0;
  double transfer_us = 0, worker_us = 0;  // the two parts of dispatch_us
  bool has_stages = false;                // the result carried every stamp named above
  int64_t output_bytes = 0;               // fleet: the bytes of the result's outputs
};

// An ordered JSON object built by hand (values are numbers, strings or raw JSON).
class JsonObject {
 public:
  void Add(const std::string& key, double value);
  void Add(const std::string& key, int64_t value);
  void Add(const std::string& key, const std::string& value);
  void AddRaw(const std::string& key, std::string json);
  std::string Dump() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

std::string JsonQuote(const std::string& s);

// The p-th percentile (0..100, nearest rank) of `sorted`, which must be sorted; 0 when empty.
double Percentile(const std::vector<double>& sorted, double p);

// User + system CPU seconds this process has used so far (getrusage).
double ProcessCpuSeconds();

// Adds jobs, failed, seconds, throughput, p50/p90/p95/p99/max_ms, mean_ms, batch_size_mean,
// batch_sizes (histogram) and, when `stages` is set, share {submit, queue, dispatch, compute,
// delivery}, stage_mean_us, and stage_p50_us (the same stages plus dispatch's parts transfer and
// worker; medians over the jobs with stamps) to *json, and prints them to stdout. `jobs` is the
// number of jobs done (raw mode: forward calls x batch), `samples` their latencies.
// `input_bytes` per job (tensor bytes): with it, also input_bytes_per_job, output_bytes_per_job
// (the mean over the samples) and the MB/s (10^6 bytes) each way, input_mbps and output_mbps.
void Summarize(const std::string& label, const std::vector<Sample>& samples, int64_t jobs,
               int64_t failed, double seconds, bool stages, int64_t input_bytes,
               JsonObject* json);

}  // namespace ferry::bench
