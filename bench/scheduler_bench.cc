// ferry-scheduler-bench: how long the broker's one thread spends taking the jobs of one big
// SUBMIT out of its scheduler -- all expiring at once (they share their deadline), cancelled
// oldest or newest first, dispatched -- with no sockets and no other processes. The broker
// serves nothing while it does this, so a cost that grows faster than the jobs is a stall.
//
//   ferry-scheduler-bench [JOBS=10000]
//
// It prints milliseconds for the whole batch and microseconds per job, per case.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "scheduler.h"

namespace {

using Clock = std::chrono::steady_clock;
using ferry::broker::Chunk;
using ferry::broker::Job;
using ferry::broker::Scheduler;

// A scheduler holding `n` queued jobs of one model, as one SUBMIT leaves them: the same
// deadline (one `now`, one timeout) and consecutive seqs. Their ids go to *ids, oldest first.
std::unique_ptr<Scheduler> Filled(int n, std::vector<std::string>* ids) {
  auto s = std::make_unique<Scheduler>();
  ids->clear();
  for (int i = 0; i < n; ++i) {
    auto j = std::make_unique<Job>();
    j->id = "job-" + std::to_string(i);
    j->model = "m";
    j->deadline_us = 1000;
    ids->push_back(j->id);
    if (!s->Add(std::move(j)).ok()) std::abort();
  }
  return s;
}

template <typename F>
void Report(const char* what, int n, F&& f) {
  std::vector<std::string> ids;
  auto s = Filled(n, &ids);
  const auto t0 = Clock::now();
  const size_t taken = f(*s, ids);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (taken != static_cast<size_t>(n) || s->deadlines() != 0) {
    std::fprintf(stderr, "%s: took %zu of %d jobs, %zu deadlines left\n", what, taken, n,
                 s->deadlines());
    std::exit(1);
  }
  std::printf("%-22s %8d jobs %10.1f ms %8.2f us/job\n", what, n, ms, 1000.0 * ms / n);
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  if (n <= 0) {
    std::fprintf(stderr, "usage: ferry-scheduler-bench [JOBS=10000]\n");
    return 2;
  }
  Report("expire all", n,
         [](Scheduler& s, const std::vector<std::string>&) { return s.TakeExpired(2000).size(); });
  Report("cancel oldest first", n, [](Scheduler& s, const std::vector<std::string>& ids) {
    size_t taken = 0;
    for (const auto& id : ids) taken += s.Take(id) != nullptr;
    return taken;
  });
  Report("cancel newest first", n, [](Scheduler& s, const std::vector<std::string>& ids) {
    size_t taken = 0;
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) taken += s.Take(*it) != nullptr;
    return taken;
  });
  Report("dispatch (batches of 8)", n, [n](Scheduler& s, const std::vector<std::string>&) {
    ferry::protocol::WorkerHello hello;
    hello.worker = "w";
    hello.device = "cpu";
    hello.capacity = n;
    hello.models = {{"m", 8, std::nullopt}};
    s.AddWorker("w", std::move(hello), 0);
    size_t taken = 0;
    Chunk c;
    while (s.NextChunk(&c)) taken += c.jobs.size();
    return taken;
  });
  return 0;
}
