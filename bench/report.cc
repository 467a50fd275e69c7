#include "report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace ferry::bench {
namespace {

std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream out;
  out.precision(6);
  out << v;
  return out.str();
}

}  // namespace

void JsonObject::Add(const std::string& key, double value) { AddRaw(key, Number(value)); }
void JsonObject::Add(const std::string& key, int64_t value) { AddRaw(key, std::to_string(value)); }
void JsonObject::Add(const std::string& key, const std::string& value) {
  AddRaw(key, JsonQuote(value));
}
void JsonObject::AddRaw(const std::string& key, std::string json) {
  for (auto& field : fields_) {
    if (field.first == key) {
      field.second = std::move(json);
      return;
    }
  }
  fields_.emplace_back(key, std::move(json));
}

std::string JsonObject::Dump() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += JsonQuote(fields_[i].first) + ": " + fields_[i].second;
  }
  return out + "}";
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  const size_t i = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return sorted[std::min(i, sorted.size() - 1)];
}

void Summarize(const std::string& label, const std::vector<Sample>& samples, int64_t jobs,
               int64_t failed, double seconds, bool stages, int64_t input_bytes,
               JsonObject* json) {
  std::vector<double> lat;
  lat.reserve(samples.size());
  double batch_sum = 0, lat_sum = 0, weight = 0, output_bytes = 0;
  double st[5] = {0, 0, 0, 0, 0};
  std::map<int64_t, int64_t> hist;
  for (const Sample& s : samples) {
    lat.push_back(s.latency_ms);
    lat_sum += s.latency_ms;
    batch_sum += static_cast<double>(s.batch_size);
    weight += 1;
    ++hist[s.batch_size];
    st[0] += s.submit_us;
    st[1] += s.queue_us;
    st[2] += s.dispatch_us;
    st[3] += s.compute_us;
    st[4] += s.delivery_us;
    output_bytes += static_cast<double>(s.output_bytes);
  }
  std::sort(lat.begin(), lat.end());
  const double n = std::max(1.0, weight);
  const double throughput = seconds > 0 ? static_cast<double>(jobs) / seconds : 0;
  json->Add("jobs", jobs);
  json->Add("failed", failed);
  json->Add("seconds", seconds);
  json->Add("throughput", throughput);
  json->Add("p50_ms", Percentile(lat, 50));
  json->Add("p90_ms", Percentile(lat, 90));
  json->Add("p95_ms", Percentile(lat, 95));
  json->Add("p99_ms", Percentile(lat, 99));
  json->Add("max_ms", lat.empty() ? 0.0 : lat.back());
  json->Add("mean_ms", lat_sum / n);
  json->Add("batch_size_mean", batch_sum / n);
  std::string h = "{";
  for (const auto& [b, count] : hist)
    h += (h.size() > 1 ? ", " : "") + JsonQuote(std::to_string(b)) + ": " + std::to_string(count);
  json->AddRaw("batch_sizes", h + "}");
  std::printf(
      "%s: %lld jobs, %lld failed, %.2f s: %.0f jobs/s; latency ms p50 %.3f p90 %.3f "
      "p95 %.3f p99 %.3f max %.3f; mean batch %.1f\n",
      label.c_str(), static_cast<long long>(jobs), static_cast<long long>(failed), seconds,
      throughput, Percentile(lat, 50), Percentile(lat, 90), Percentile(lat, 95),
      Percentile(lat, 99), lat.empty() ? 0.0 : lat.back(), batch_sum / n);
  if (input_bytes > 0) {
    const double in_mbps = throughput * static_cast<double>(input_bytes) / 1e6;
    const double out_per_job = output_bytes / n;
    const double out_mbps = throughput * out_per_job / 1e6;
    json->Add("input_bytes_per_job", input_bytes);
    json->Add("output_bytes_per_job", out_per_job);
    json->Add("input_mbps", in_mbps);
    json->Add("output_mbps", out_mbps);
    std::printf("  bytes: %lld in per job (%.1f MB/s), %.0f out per job (%.1f MB/s)\n",
                static_cast<long long>(input_bytes), in_mbps, out_per_job, out_mbps);
  }
  if (!stages) return;
  const char* names[5] = {"submit", "queue", "dispatch", "compute", "delivery"};
  const double total = std::max(1e-9, lat_sum * 1000.0);
  std::string share = "{", mean = "{";
  std::printf("  time share:");
  for (int i = 0; i < 5; ++i) {
    share += std::string(i ? ", " : "") + JsonQuote(names[i]) + ": " + Number(st[i] / total);
    mean += std::string(i ? ", " : "") + JsonQuote(names[i]) + ": " + Number(st[i] / n);
    std::printf(" %s %.0f%% (%.0f us)", names[i], 100 * st[i] / total, st[i] / n);
  }
  std::printf("\n");
  json->AddRaw("share", share + "}");
  json->AddRaw("stage_mean_us", mean + "}");

  // Medians: at light load a few slow jobs (a preempted process) move the means a lot.
  const std::pair<const char*, double Sample::*> parts[7] = {
      {"submit", &Sample::submit_us},     {"queue", &Sample::queue_us},
      {"dispatch", &Sample::dispatch_us}, {"transfer", &Sample::transfer_us},
      {"worker", &Sample::worker_us},     {"compute", &Sample::compute_us},
      {"delivery", &Sample::delivery_us}};
  double median[7];
  std::string p50 = "{";
  for (int i = 0; i < 7; ++i) {
    std::vector<double> v;
    v.reserve(samples.size());
    for (const Sample& s : samples)
      if (s.has_stages) v.push_back(s.*parts[i].second);
    std::sort(v.begin(), v.end());
    median[i] = Percentile(v, 50);
    p50 += std::string(i ? ", " : "") + JsonQuote(parts[i].first) + ": " + Number(median[i]);
  }
  std::printf(
      "  stage p50 us: submit %.0f queue %.0f dispatch %.0f (transfer %.0f, worker %.0f) "
      "compute %.0f delivery %.0f\n",
      median[0], median[1], median[2], median[3], median[4], median[5], median[6]);
  json->AddRaw("stage_p50_us", p50 + "}");
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace ferry::bench
