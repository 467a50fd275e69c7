#pragma once
// Drives a running fleet through the SDK (ferry::client::Client) and records one Sample per job.
//
// Closed loop (RunClosed): `concurrency` jobs in flight, spread over `loaders` threads. Each
// loader keeps its share k = concurrency / loaders of jobs in flight as a pipeline: it submits
// windows of up to `submit_batch` jobs with one SubmitMany (one SUBMIT message) whenever that
// many slots are free, and otherwise Waits for its oldest outstanding job. So in-flight stays
// between k - submit_batch and k. With concurrency == loaders this is the classic loop: each
// thread Submits one job and Waits for it. Latency: SubmitMany call start -> Wait returned (a
// job whose result lands before an older one's is counted when the older one is read).
//
// With use_run, the closed loop is `concurrency` threads that each call Client::Run (Submit +
// Wait in one call, no ACCEPTED) for one job at a time; latency: Run call start -> Run returned.
//
// Open loop (RunOpen): Poisson arrivals at `rate` jobs/s. One thread submits each job at its
// intended time (jobs that are due together go in one SubmitMany); `loaders` threads Wait for
// them. Latency is measured from the job's INTENDED start, so a submitter or fleet that falls
// behind shows up as latency instead of a lower offered rate.
//
// Thread-safety: each Run* call uses the (thread-safe) client from its own threads.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferry/result.h"
#include "ferry/tensor.h"
#include "report.h"

namespace ferry::bench {

struct LoadOptions {
  std::string model = "tiny";
  std::vector<int64_t> shape{8};
  DType dtype = DType::kFloat32;
  int64_t jobs = 1000;
  int64_t concurrency = 32;  // closed loop
  double rate = 0;           // open loop: jobs/s
  int64_t loaders = 0;       // threads; 0: closed min(concurrency, 4), open 64
  int64_t submit_batch = 0;  // most jobs per SubmitMany; 0: closed max(1, k/4), open 64
  int64_t timeout_ms = 120000;
  int64_t seed = 1;
  int64_t print_results = 0;  // keep the first N results for printing
  bool use_run = false;       // closed: `concurrency` threads each call Client::Run (no ACCEPTED)
};

struct LoadResult {
  std::vector<Sample> samples;  // one per job done
  int64_t failed = 0;           // rejected, timed out or not kDone
  double seconds = 0;           // wall time of the measured run
  double inputs_cpu_s = 0;      // CPU spent making the input pool, before the timed window
  std::vector<std::pair<std::string, Result>> printed;
};

void RunClosed(client::Client& client, const LoadOptions& options, LoadResult* out);
void RunOpen(client::Client& client, const LoadOptions& options, LoadResult* out);

// A pool of random inputs of the options' shape and dtype (jobs reuse them round robin).
std::vector<Tensor> MakeInputs(const LoadOptions& options, size_t count);

}  // namespace ferry::bench
