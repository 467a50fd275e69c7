// ferry-bench: drives a running Ferry fleet through the real SDK and reports throughput,
// end-to-end latency percentiles, the batch-size distribution and where the time went.
// Closed loop: --concurrency C producer threads, each with one job in flight.
// (The open-loop --rate mode and the in-process --raw mode arrive with issue 5.)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "ferry/client.h"
#include "ferry/protocol/flags.h"

namespace {

using ferry::DType;
using ferry::Result;
using ferry::Status;
using ferry::Tensor;

struct Sample {
  double e2e_ms = 0;
  int64_t batch_size = 0;
  double queue_ms = 0, dispatch_ms = 0, compute_ms = 0;
};

std::vector<int64_t> ParseShape(const std::string& s) {
  std::vector<int64_t> shape;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) shape.push_back(std::stoll(part));
  return shape;
}

Tensor RandomTensor(const std::vector<int64_t>& shape, DType dtype, std::mt19937& rng) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  int64_t n = ferry::NumElements(shape);
  t.data.resize(n * ferry::ItemSize(dtype));
  if (dtype == DType::kFloat32) {
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      float v = d(rng);
      std::memcpy(&t.data[i * 4], &v, 4);
    }
  } else {
    for (auto& c : t.data) c = static_cast<char>(rng() & (dtype == DType::kBool ? 1 : 0xff));
  }
  return t;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

void PrintResult(const std::string& id, const Result& r) {
  std::printf("  %s  %s  worker=%s batch=%lld", id.c_str(), ferry::JobStateName(r.state),
              r.worker.c_str(), static_cast<long long>(r.batch_size));
  if (!r.outputs.empty() && r.outputs[0].dtype == DType::kFloat32) {
    auto v = r.outputs[0].As<float>();
    std::printf("  out[0][:4]=");
    for (size_t i = 0; i < std::min<size_t>(4, v.size()); ++i) std::printf("%s%.4f", i ? "," : "", v[i]);
  }
  if (!r.error.ok()) std::printf("  error=%s", r.error.ToString().c_str());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string frontend = "tcp://127.0.0.1:5555", redis = "redis://127.0.0.1:6379";
  std::string model = "tiny", shape_text = "8", dtype_text = "float32", json_path;
  int64_t jobs = 1000, concurrency = 32, print_results = 0, seed = 1;
  ferry::protocol::FlagSet flags("ferry-bench", "Drives a Ferry fleet and measures it.");
  flags.String("frontend", &frontend, "broker frontend");
  flags.String("redis", &redis, "Redis URL of the result store");
  flags.String("model", &model, "model name");
  flags.String("shape", &shape_text, "input shape without the batch dim, e.g. 3,224,224");
  flags.String("dtype", &dtype_text, "input dtype");
  flags.Int("jobs", &jobs, "jobs to run");
  flags.Int("concurrency", &concurrency, "jobs in flight (closed loop)");
  flags.Int("print-results", &print_results, "print the first N results");
  flags.Int("seed", &seed, "random seed of the inputs");
  flags.String("json", &json_path, "write the summary as JSON to this file");
  int rc = ferry::protocol::HandleFlagResult(flags, flags.Parse(argc, argv));
  if (rc >= 0) return rc;
  DType dtype;
  if (!ferry::ParseDType(dtype_text, &dtype)) {
    std::fprintf(stderr, "unknown dtype %s\n", dtype_text.c_str());
    return 2;
  }
  std::vector<int64_t> shape = ParseShape(shape_text);

  ferry::client::ClientOptions options;
  options.frontend = frontend;
  options.redis = redis;
  std::unique_ptr<ferry::client::Client> client;
  Status s = ferry::client::Client::Create(options, &client);
  if (!s.ok()) {
    std::fprintf(stderr, "client: %s\n", s.ToString().c_str());
    return 1;
  }

  std::atomic<int64_t> next{0}, failed{0};
  std::mutex mu;
  std::vector<Sample> samples;
  std::vector<std::pair<std::string, Result>> printed;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + t));
      std::vector<Sample> local;
      while (next.fetch_add(1) < jobs) {
        ferry::client::Job job;
        job.model = model;
        job.inputs = {RandomTensor(shape, dtype, rng)};
        auto t0 = std::chrono::steady_clock::now();
        std::string id;
        Result r;
        Status st = client->Submit(job, &id);
        if (st.ok()) st = client->Wait(id, 120000, &r);
        auto t1 = std::chrono::steady_clock::now();
        if (!st.ok() || r.state != ferry::JobState::kDone) {
          if (failed.fetch_add(1) < 5)
            std::fprintf(stderr, "job %s: %s %s\n", id.c_str(), st.ToString().c_str(),
                         r.error.ToString().c_str());
          continue;
        }
        Sample smp;
        smp.e2e_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        smp.batch_size = r.batch_size;
        auto at = [&](const char* k) { return r.timing_us.count(k) ? r.timing_us.at(k) : 0; };
        smp.queue_ms = (at("dispatched") - at("submitted")) / 1000.0;
        smp.dispatch_ms = (at("compute_start") - at("dispatched")) / 1000.0;
        smp.compute_ms = (at("compute_end") - at("compute_start")) / 1000.0;
        local.push_back(smp);
        std::lock_guard<std::mutex> lock(mu);
        if (static_cast<int64_t>(printed.size()) < print_results) printed.emplace_back(id, r);
      }
      std::lock_guard<std::mutex> lock(mu);
      samples.insert(samples.end(), local.begin(), local.end());
    });
  }
  for (auto& th : threads) th.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  for (const auto& [id, r] : printed) PrintResult(id, r);
  std::vector<double> e2e;
  double bs_sum = 0, q = 0, d = 0, c = 0;
  std::map<int64_t, int64_t> hist;
  for (const auto& smp : samples) {
    e2e.push_back(smp.e2e_ms);
    bs_sum += smp.batch_size;
    ++hist[smp.batch_size];
    q += smp.queue_ms;
    d += smp.dispatch_ms;
    c += smp.compute_ms;
  }
  double n = std::max<double>(1, samples.size());
  double total = std::max(1e-9, std::accumulate(e2e.begin(), e2e.end(), 0.0));
  double throughput = samples.size() / seconds;
  std::printf("%s: %zu jobs ok, %lld failed in %.2f s: %.0f jobs/s; latency p50 %.2f ms, p90 %.2f,"
              " p99 %.2f, max %.2f; mean batch %.1f; time in queue %.0f%%, dispatch %.0f%%, "
              "compute %.0f%%, delivery %.0f%%\n",
              model.c_str(), samples.size(), static_cast<long long>(failed.load()), seconds,
              throughput, Percentile(e2e, 50), Percentile(e2e, 90), Percentile(e2e, 99),
              Percentile(e2e, 100), bs_sum / n, 100 * q / total, 100 * d / total, 100 * c / total,
              100 * (total - q - d - c) / total);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"mode\":\"fleet\",\"model\":\"" << model << "\",\"jobs\":" << samples.size()
        << ",\"failed\":" << failed.load() << ",\"seconds\":" << seconds
        << ",\"throughput\":" << throughput << ",\"concurrency\":" << concurrency
        << ",\"p50_ms\":" << Percentile(e2e, 50) << ",\"p90_ms\":" << Percentile(e2e, 90)
        << ",\"p99_ms\":" << Percentile(e2e, 99) << ",\"max_ms\":" << Percentile(e2e, 100)
        << ",\"batch_size_mean\":" << bs_sum / n << ",\"batch_sizes\":{";
    bool first = true;
    for (const auto& [b, count] : hist) {
      out << (first ? "" : ",") << "\"" << b << "\":" << count;
      first = false;
    }
    out << "},\"share\":{\"queue\":" << q / total << ",\"dispatch\":" << d / total
        << ",\"compute\":" << c / total << ",\"delivery\":" << (total - q - d - c) / total
        << "}}\n";
  }
  return failed.load() == 0 ? 0 : 1;
}
