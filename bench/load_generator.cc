#include "load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;
using client::Client;
using client::Job;
using client::SubmitOutcome;

constexpr size_t kInputPool = 64;

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A job in flight: its id and when it (was meant to) start, on both clocks.
struct Pending {
  std::string id;
  Clock::time_point start;
  int64_t start_wall_us = 0;
};

// Shared bookkeeping of one run: failures, samples, printed results.
class Recorder {
 public:
  Recorder(const LoadOptions& o, LoadResult* out) : options_(o), out_(out) {}

  void Fail(const std::string& id, const Status& s, const Result* r) {
    if (failed_.fetch_add(1) < 5) {
      std::fprintf(stderr, "job %s: %s %s\n", id.c_str(), s.ToString().c_str(),
                   r ? r->error.ToString().c_str() : "");
    }
  }

  // Waits for p's result and records it into *local.
  void Finish(Client& client, const Pending& p, std::vector<Sample>* local) {
    Result r;
    Status s = client.Wait(p.id, static_cast<int>(options_.timeout_ms), &r);
    Record(p, s, std::move(r), local);
  }

  // Records the outcome `s`, `r` of p, which ended now, into *local.
  void Record(const Pending& p, const Status& s, Result r, std::vector<Sample>* local) {
    const auto end = Clock::now();
    const int64_t end_wall = WallMicros();
    if (!s.ok() || r.state != JobState::kDone) return Fail(p.id, s, &r);
    Sample smp;
    smp.latency_ms = std::chrono::duration<double, std::milli>(end - p.start).count();
    smp.batch_size = r.batch_size;
    for (const auto& t : r.outputs) smp.output_bytes += static_cast<int64_t>(t.data.size());
    auto at = [&](const char* k) {
      auto it = r.timing_us.find(k);
      return it == r.timing_us.end() ? 0.0 : static_cast<double>(it->second);
    };
    if (at("submitted") > 0 && at("compute_end") > 0) {
      smp.submit_us = at("submitted") - static_cast<double>(p.start_wall_us);
      smp.queue_us = at("dispatched") - at("submitted");
      smp.dispatch_us = at("compute_start") - at("dispatched");
      smp.transfer_us = at("received") - at("dispatched");
      smp.worker_us = at("compute_start") - at("received");
      smp.has_stages = at("dispatched") > 0 && at("received") > 0 && at("compute_start") > 0;
      smp.compute_us = at("compute_end") - at("compute_start");
      smp.delivery_us = static_cast<double>(end_wall) - at("compute_end");
    }
    local->push_back(smp);
    if (options_.print_results > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int64_t>(out_->printed.size()) < options_.print_results)
        out_->printed.emplace_back(p.id, std::move(r));
    }
  }

  void Merge(std::vector<Sample>* local) {
    std::lock_guard<std::mutex> lock(mu_);
    out_->samples.insert(out_->samples.end(), local->begin(), local->end());
    local->clear();
  }

  int64_t failed() const { return failed_.load(); }

 private:
  const LoadOptions& options_;
  LoadResult* out_;
  std::mutex mu_;
  std::atomic<int64_t> failed_{0};
};

// Submits jobs[0..n) in one call; pushes each accepted job to `sink`, records rejections.
template <typename Sink>
void SubmitWindow(Client& client, const std::vector<Job>& window, size_t n, Clock::time_point start,
                  int64_t start_wall, const std::vector<Clock::time_point>* intended, Recorder* rec,
                  Sink&& sink) {
  std::vector<SubmitOutcome> outcomes;
  Status s = client.SubmitMany(window, &outcomes);
  for (size_t i = 0; i < n; ++i) {
    const SubmitOutcome& o = outcomes[i];
    if (!o.status.ok()) {
      rec->Fail(o.id, o.status, nullptr);
      continue;
    }
    Pending p{o.id, start, start_wall};
    if (intended) {  // open loop: from the intended start, on both clocks
      p.start = (*intended)[i];
      p.start_wall_us =
          start_wall -
          std::chrono::duration_cast<std::chrono::microseconds>(start - p.start).count();
    }
    sink(std::move(p));
  }
  (void)s;  // a failed call is reflected in every outcome
}

Job BaseJob(const LoadOptions& o) {
  Job job;
  job.model = o.model;
  return job;
}

}  // namespace

std::vector<Tensor> MakeInputs(const LoadOptions& o, size_t count) {
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::vector<Tensor> pool;
  for (size_t k = 0; k < count; ++k) {
    Tensor t;
    t.dtype = o.dtype;
    t.shape = o.shape;
    const int64_t n = NumElements(o.shape);
    t.data.resize(static_cast<size_t>(n) * ItemSize(o.dtype));
    if (o.dtype == DType::kFloat32) {
      std::uniform_real_distribution<float> d(-1.f, 1.f);
      for (int64_t i = 0; i < n; ++i) {
        float v = d(rng);
        std::memcpy(&t.data[static_cast<size_t>(i) * 4], &v, 4);
      }
    } else {
      for (auto& c : t.data) c = static_cast<char>(rng() & (o.dtype == DType::kBool ? 1 : 0xff));
    }
    pool.push_back(std::move(t));
  }
  return pool;
}

namespace {

// The input pool, its CPU cost noted in `out` (the bench's CPU per job is taken without it).
std::vector<Tensor> MakePool(const LoadOptions& o, LoadResult* out) {
  const double cpu0 = ProcessCpuSeconds();
  std::vector<Tensor> inputs = MakeInputs(o, kInputPool);
  out->inputs_cpu_s = ProcessCpuSeconds() - cpu0;
  return inputs;
}

}  // namespace

// Closed loop through Client::Run: `concurrency` threads, each running one job at a time.
void RunClosedWithRun(Client& client, const LoadOptions& o, LoadResult* out) {
  const std::vector<Tensor> inputs = MakePool(o, out);
  Recorder rec(o, out);
  std::atomic<int64_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < o.concurrency; ++t) {
    threads.emplace_back([&, t] {
      Job job = BaseJob(o);
      job.inputs.assign(1, inputs[static_cast<size_t>(t * 7) % inputs.size()]);
      std::vector<Sample> local;
      while (next.fetch_add(1) < o.jobs) {
        job.id.clear();
        Pending p{"", Clock::now(), WallMicros()};
        Result r;
        Status s = client.Run(job, static_cast<int>(o.timeout_ms), &r, &p.id);
        rec.Record(p, s, std::move(r), &local);
      }
      rec.Merge(&local);
    });
  }
  for (auto& th : threads) th.join();
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out->failed = rec.failed();
}

void RunClosed(Client& client, const LoadOptions& o, LoadResult* out) {
  *out = LoadResult();
  if (o.use_run) return RunClosedWithRun(client, o, out);
  const int64_t loaders = std::max<int64_t>(
      1, o.loaders > 0 ? std::min(o.loaders, o.concurrency) : std::min<int64_t>(o.concurrency, 4));
  const std::vector<Tensor> inputs = MakePool(o, out);
  Recorder rec(o, out);
  std::atomic<int64_t> next{0};
  // Claims up to n of the remaining jobs; returns how many.
  auto claim = [&](int64_t n) {
    const int64_t first = next.fetch_add(n);
    return std::max<int64_t>(0, std::min(n, o.jobs - first));
  };
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < loaders; ++t) {
    // Loader t keeps k jobs in flight; the first (concurrency % loaders) take one more.
    const int64_t k = o.concurrency / loaders + (t < o.concurrency % loaders ? 1 : 0);
    threads.emplace_back([&, t, k] {
      const int64_t batch =
          std::max<int64_t>(1, std::min(k, o.submit_batch > 0 ? o.submit_batch : k / 4));
      // Each window slot keeps its input for the whole run (slot i: input t*7+i of the pool),
      // so submitting copies no tensor bytes here; only the ids are reset.
      std::vector<Job> slots(static_cast<size_t>(batch), BaseJob(o)), window;
      for (size_t i = 0; i < slots.size(); ++i)
        slots[i].inputs.assign(1, inputs[(static_cast<size_t>(t) * 7 + i) % inputs.size()]);
      std::deque<Pending> pending;
      std::vector<Sample> local;
      bool more = true;
      while (true) {
        const int64_t free = k - static_cast<int64_t>(pending.size());
        if (more && (free >= batch || pending.empty())) {
          const int64_t n = claim(std::min(free, batch));
          if (n == 0) {
            more = false;
            continue;
          }
          // A short window (the run's tail) goes through a copy of the first n slots.
          std::vector<Job>& jobs = n == batch ? slots : window;
          if (n < batch) window.assign(slots.begin(), slots.begin() + n);
          for (auto& job : jobs) job.id.clear();
          SubmitWindow(client, jobs, static_cast<size_t>(n), Clock::now(), WallMicros(), nullptr,
                       &rec, [&](Pending p) { pending.push_back(std::move(p)); });
          continue;
        }
        if (pending.empty()) break;
        rec.Finish(client, pending.front(), &local);
        pending.pop_front();
      }
      rec.Merge(&local);
    });
  }
  for (auto& th : threads) th.join();
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out->failed = rec.failed();
}

void RunOpen(Client& client, const LoadOptions& o, LoadResult* out) {
  *out = LoadResult();
  const int64_t loaders = o.loaders > 0 ? o.loaders : 64;
  const size_t batch = static_cast<size_t>(o.submit_batch > 0 ? o.submit_batch : 64);
  const std::vector<Tensor> inputs = MakePool(o, out);
  Recorder rec(o, out);

  // The arrival schedule, drawn up front: exponential gaps with mean 1/rate.
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed) * 104729u);
  std::exponential_distribution<double> gap(o.rate);
  std::vector<Clock::time_point> intended(static_cast<size_t>(o.jobs));
  const auto start = Clock::now() + std::chrono::milliseconds(5);
  const int64_t start_wall = WallMicros() + 5000;
  double t = 0;
  for (auto& when : intended) {
    t += gap(rng);
    when = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
  }

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> queue;
  bool submitted_all = false;
  std::vector<std::thread> waiters;
  for (int64_t w = 0; w < loaders; ++w) {
    waiters.emplace_back([&] {
      std::vector<Sample> local;
      while (true) {
        Pending p;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return !queue.empty() || submitted_all; });
          if (queue.empty()) break;
          p = std::move(queue.front());
          queue.pop_front();
        }
        rec.Finish(client, p, &local);
      }
      rec.Merge(&local);
    });
  }

  // Job k uses input k % pool; the single-job window (the usual case at modest rates) is
  // reused per pool entry so that no tensor bytes are copied per job.
  std::vector<std::vector<Job>> singles(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    singles[i].assign(1, BaseJob(o));
    singles[i][0].inputs.assign(1, inputs[i]);
  }
  std::vector<Job> window;
  std::vector<Clock::time_point> due;
  size_t next = 0;
  while (next < intended.size()) {
    std::this_thread::sleep_until(intended[next]);
    const auto now = Clock::now();
    due.clear();
    window.clear();
    const size_t first = next;
    while (next < intended.size() && intended[next] <= now && due.size() < batch) {
      due.push_back(intended[next]);
      ++next;
    }
    std::vector<Job>* jobs = &singles[first % inputs.size()];
    if (due.size() > 1) {  // behind schedule: the due jobs go in one SUBMIT
      for (size_t k = first; k < next; ++k) window.push_back(singles[k % inputs.size()][0]);
      jobs = &window;
    }
    for (auto& job : *jobs) job.id.clear();
    SubmitWindow(client, *jobs, due.size(), start, start_wall, &due, &rec, [&](Pending p) {
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(p));
      }
      cv.notify_one();
    });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    submitted_all = true;
  }
  cv.notify_all();
  for (auto& th : waiters) th.join();
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out->failed = rec.failed();
}

}  // namespace ferry::bench
