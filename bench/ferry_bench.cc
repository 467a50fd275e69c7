// ferry-bench: drives a running Ferry fleet through the real SDK, or runs the model in-process
// (--raw), and reports throughput, latency percentiles, the batch-size distribution and where
// the time went. See docs/performance.md.
//
//   closed loop  --concurrency C                 C jobs in flight (pipelined SubmitMany windows)
//   open loop    --rate R                        Poisson arrivals, latency from intended start
//   raw          --raw M.pt --batch B --device D the model alone in a tight loop at batch B

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "ferry/client.h"
#include "ferry/protocol/redis.h"
#include "ferry/runtime/flags.h"
#include "ferry/runtime/malloc_policy.h"
#include "ferry/runtime/redis_flags.h"
#include "load_generator.h"
#include "raw_runner.h"
#include "report.h"

namespace {

using ferry::Status;
using ferry::bench::JsonObject;

bool ParseShape(const std::string& s, std::vector<int64_t>* shape) {
  shape->clear();
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0) return false;
    shape->push_back(v);
  }
  return true;
}

void PrintResult(const std::string& id, const ferry::Result& r) {
  std::printf("  %s  %s  worker=%s batch=%lld", id.c_str(), ferry::JobStateName(r.state),
              r.worker.c_str(), static_cast<long long>(r.batch_size));
  if (!r.outputs.empty() && r.outputs[0].dtype == ferry::DType::kFloat32) {
    auto v = r.outputs[0].As<float>();
    std::printf("  out[0][:4]=");
    for (size_t i = 0; i < std::min<size_t>(4, v.size()); ++i)
      std::printf("%s%.4f", i ? "," : "", v[i]);
  }
  if (!r.error.ok()) std::printf("  error=%s", r.error.ToString().c_str());
  std::printf("\n");
}

std::string CommandLine(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return cmd;
}

// Waits until the broker lists at least `want` workers (STATS), up to 60 s.
Status WaitForWorkers(ferry::client::Client& client, int64_t want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string json;
  while (true) {
    int64_t n = 0;
    if (client.Stats(&json).ok()) {
      for (size_t at = json.find("\"device\""); at != std::string::npos;
           at = json.find("\"device\"", at + 1))
        ++n;
      if (n >= want) return Status::Ok();
    }
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Internal(std::to_string(n) + " of " + std::to_string(want) +
                              " workers after 60 s: " + json);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string frontend = "tcp://127.0.0.1:5555", redis = "redis://127.0.0.1:6379";
  std::string shape_text = "8", dtype_text = "float32", json_path, rate_text = "0";
  std::string raw_path, device = "cpu", label;
  ferry::bench::LoadOptions load;
  int64_t warmup = 0, batch = 1, threads = 0, wait_workers = 0;
  int64_t stored_input_bytes = ferry::client::ClientOptions().stored_input_bytes;
  int64_t attached_input_bytes = ferry::client::ClientOptions().attached_input_bytes;
  bool no_push = false, consume = false, half = false;
  ferry::runtime::FlagSet flags(
      "ferry-bench",
      "Drives a Ferry fleet through the SDK (closed loop: --concurrency; open loop: --rate) or "
      "runs the model in-process (--raw) and measures throughput and latency.");
  flags.String("frontend", &frontend, "broker frontend");
  flags.String("redis", &redis,
               "Redis URL of the result store, redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or "
               "unix:///PATH");
  ferry::protocol::RedisAccessFiles redis_files;
  ferry::runtime::AddRedisAccessFlags(&flags, &redis_files);
  std::string curve_server_public, curve_secret;
  flags.String("curve-server-public", &curve_server_public,
               "CURVE: the broker's public certificate (its NAME.key)");
  flags.String("curve-secret", &curve_secret,
               "CURVE: this producer's secret certificate (NAME.key_secret)");
  flags.String("model", &load.model, "model name (fleet modes)");
  flags.String("shape", &shape_text, "one job's input shape without the batch dim (3,224,224)");
  flags.String("dtype", &dtype_text, "input dtype");
  flags.Int("jobs", &load.jobs, "jobs to measure");
  flags.Int("warmup", &warmup, "jobs run first and not measured");
  flags.Int("concurrency", &load.concurrency, "closed loop: jobs in flight");
  flags.String("rate", &rate_text, "open loop: Poisson arrivals at this many jobs/s (0: closed)");
  flags.Int("loaders", &load.loaders,
            "threads submitting/waiting (0: closed min(concurrency,4), open 64)");
  flags.Int("submit-batch", &load.submit_batch,
            "most jobs per SubmitMany (0: closed concurrency/loaders/4, open 64)");
  flags.Int("timeout-ms", &load.timeout_ms, "Wait timeout per job");
  flags.Int("print-results", &load.print_results, "print the first N results");
  flags.Int("seed", &load.seed, "random seed of the inputs and arrivals");
  flags.String("raw", &raw_path, "run this TorchScript file in-process instead of a fleet");
  flags.Int("batch", &batch, "raw: jobs per forward");
  flags.String("device", &device, "raw: cpu, cuda or cuda:N");
  flags.Int("threads", &threads, "raw: intra-op torch threads (0: libtorch's default)");
  flags.Bool("half", &half,
             "raw: float16 weights and floating inputs, as a model repository's half = true");
  flags.Bool("no-push", &no_push,
             "broker notices only: no result notices straight from workers (the SDK's "
             "push_results off), to measure what they save");
  flags.Int("stored-input-bytes", &stored_input_bytes,
            "the SDK's stored_input_bytes: inputs of at least this size go to Redis, not through "
            "the broker (0: none)");
  flags.Int("attached-input-bytes", &attached_input_bytes,
            "the SDK's attached_input_bytes: inputs of at least this size that are not stored "
            "travel in ZeroMQ frames of their own (0: inside the SUBMIT body)");
  flags.Bool("consume", &consume,
             "the SDK's consume_results: results read from Redis are deleted as they are read "
             "(GETDEL)");
  flags.Bool("run", &load.use_run,
             "closed loop through Client::Run (submit and wait in one call; the broker sends no "
             "ACCEPTED): --concurrency threads, one job each at a time (--loaders, --submit-batch "
             "do not apply)");
  flags.Int("wait-workers", &wait_workers, "first wait (up to 60 s) for N workers at the broker");
  flags.String("label", &label, "name of this run in the output and JSON (default: the model)");
  flags.String("json", &json_path, "write the summary as one JSON object to this file");
  int rc = ferry::runtime::HandleFlagResult(flags, flags.Parse(argc, argv));
  if (rc >= 0) return rc;
  if (!ferry::ParseDType(dtype_text, &load.dtype)) {
    std::fprintf(stderr, "ferry-bench: unknown dtype %s\n", dtype_text.c_str());
    return 2;
  }
  if (!ParseShape(shape_text, &load.shape)) {
    std::fprintf(stderr, "ferry-bench: bad --shape %s\n", shape_text.c_str());
    return 2;
  }
  char* end = nullptr;
  load.rate = std::strtod(rate_text.c_str(), &end);
  if (*end != '\0' || load.rate < 0) {
    std::fprintf(stderr, "ferry-bench: bad --rate %s\n", rate_text.c_str());
    return 2;
  }
  if (load.use_run && (load.rate > 0 || !raw_path.empty())) {
    std::fprintf(stderr, "ferry-bench: --run is a closed-loop fleet mode (no --rate, no --raw)\n");
    return 2;
  }
  if (load.jobs < 1 || load.concurrency < 1 || warmup < 0) {
    std::fprintf(stderr, "ferry-bench: --jobs and --concurrency must be >= 1\n");
    return 2;
  }

  JsonObject json;
  json.Add("command", CommandLine(argc, argv));
  std::vector<ferry::bench::Sample> samples;
  int64_t jobs_done = 0, failed = 0;
  double seconds = 0;
  bool stages = false;
  if (!raw_path.empty()) {
    ferry::bench::RawOptions raw;
    raw.path = raw_path;
    raw.device = device;
    raw.batch = batch;
    raw.shape = load.shape;
    raw.dtype = load.dtype;
    raw.jobs = load.jobs;
    raw.warmup = warmup;
    raw.threads = threads;
    raw.seed = load.seed;
    raw.half = half;
    // The limit is taken with ferry-worker's allocator settings: the same model code allocates
    // the same activations (without them, a ResNet-18 batch page-faults its ~25 MB buffers in
    // afresh on every forward). The fleet mode leaves the producer's allocator as it is.
    std::string malloc_policy;
    json.AddRaw("malloc_keeps_freed",
                ferry::runtime::KeepFreedMemory(&malloc_policy) ? "true" : "false");
    const double cpu0 = ferry::bench::ProcessCpuSeconds();
    Status s = ferry::bench::RunRaw(raw, &samples, &jobs_done, &seconds);
    json.Add("bench_cpu_s", ferry::bench::ProcessCpuSeconds() - cpu0);
    if (!s.ok()) {
      std::fprintf(stderr, "ferry-bench: %s\n", s.ToString().c_str());
      return 1;
    }
    if (label.empty()) label = "raw " + raw_path;
    json.Add("mode", std::string("raw"));
    json.Add("model", raw_path);
    json.Add("device", device);
    json.Add("batch", batch);
    json.Add("threads", threads);
    json.AddRaw("half", half ? "true" : "false");
    json.Add("torch", ferry::bench::TorchInfo());
  } else {
    ferry::client::ClientOptions options;
    options.frontend = frontend;
    options.redis = redis;
    options.redis_password_file = redis_files.password_file;
    options.redis_tls_ca = redis_files.tls_ca;
    options.redis_tls_cert = redis_files.tls_cert;
    options.redis_tls_key = redis_files.tls_key;
    options.curve_server_public = curve_server_public;
    options.curve_secret = curve_secret;
    options.push_results = !no_push;
    options.consume_results = consume;
    options.stored_input_bytes = stored_input_bytes;
    options.attached_input_bytes = attached_input_bytes;
    std::unique_ptr<ferry::client::Client> client;
    Status s = ferry::client::Client::Create(options, &client);
    if (!s.ok()) {
      std::fprintf(stderr, "ferry-bench: client: %s\n", s.ToString().c_str());
      return 1;
    }
    // The SDK connects lazily (and small results never need Redis): a wrong password or CA
    // would show only as slow or failed waits. Stop here instead.
    ferry::protocol::RedisEndpoint endpoint;
    bool refused = false;
    s = ferry::protocol::ResolveRedisEndpoint(redis, redis_files, &endpoint);
    if (s.ok()) s = ferry::protocol::CheckRedisAccess(endpoint, 5000, &refused);
    if (!s.ok() && refused) {
      std::fprintf(stderr, "ferry-bench: %s\n", s.ToString().c_str());
      return 1;
    }
    if (wait_workers > 0) {
      s = WaitForWorkers(*client, wait_workers);
      if (!s.ok()) {
        std::fprintf(stderr, "ferry-bench: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    ferry::bench::LoadResult result;
    if (warmup > 0) {
      ferry::bench::LoadOptions w = load;
      w.jobs = warmup;
      w.print_results = 0;
      ferry::bench::RunClosed(*client, w, &result);
    }
    const double cpu0 = ferry::bench::ProcessCpuSeconds();
    if (load.rate > 0) {
      ferry::bench::RunOpen(*client, load, &result);
      json.Add("mode", std::string("open"));
      json.Add("rate", load.rate);
    } else {
      ferry::bench::RunClosed(*client, load, &result);
      json.Add("mode", std::string(load.use_run ? "closed-run" : "closed"));
      json.Add("concurrency", load.concurrency);
    }
    // The producer's CPU during the run: making the input pool comes before the timed window.
    json.Add("bench_cpu_s", ferry::bench::ProcessCpuSeconds() - cpu0 - result.inputs_cpu_s);
    json.Add("inputs_cpu_s", result.inputs_cpu_s);
    json.Add("model", load.model);
    json.Add("loaders", load.loaders);
    json.Add("submit_batch", load.submit_batch);
    for (const auto& [id, r] : result.printed) PrintResult(id, r);
    samples = std::move(result.samples);
    jobs_done = static_cast<int64_t>(samples.size());
    failed = result.failed;
    seconds = result.seconds;
    stages = true;
    if (label.empty()) label = load.model;
  }
  json.Add("label", label);
  json.Add("shape", shape_text);
  json.Add("dtype", dtype_text);
  const int64_t input_bytes =
      ferry::NumElements(load.shape) * static_cast<int64_t>(ferry::ItemSize(load.dtype));
  ferry::bench::Summarize(label, samples, jobs_done, failed, seconds, stages, input_bytes, &json);
  // The whole process so far, startup included.
  json.Add("process_cpu_s", ferry::bench::ProcessCpuSeconds());
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << json.Dump() << "\n";
    if (!out) {
      std::fprintf(stderr, "ferry-bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return failed == 0 ? 0 : 1;
}
