// ferry-worker: parse flags, Create (load the models), Run until SIGTERM/SIGINT has drained.
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <thread>

#include "ferry/worker/options.h"
#include "ferry/worker/worker.h"

int main(int argc, char** argv) {
  using ferry::worker::Worker;
  ferry::worker::WorkerOptions options;
  bool help = false;
  std::string usage;
  ferry::Status s = ferry::worker::ParseWorkerFlags(argc, argv, &options, &help, &usage);
  if (!s.ok()) {
    std::fprintf(stderr, "ferry-worker: %s\n\n%s", s.message().c_str(), usage.c_str());
    return 2;
  }
  if (help) {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(options.log_level));

  // SIGINT/SIGTERM are blocked in every thread (they inherit the mask) and taken by sigtimedwait
  // below, so that a signal becomes an orderly drain instead of a handler racing the threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<Worker> worker;
  s = Worker::Create(options, &worker);
  if (!s.ok()) {
    spdlog::critical("ferry-worker: {}", s.ToString());
    return 1;
  }

  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    int received = 0;
    while (!finished.load()) {
      timespec tick{0, 100 * 1000 * 1000};
      int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig <= 0) continue;
      if (++received == 1) {
        spdlog::info("signal {}: finishing held jobs, then leaving", sig);
        worker->RequestStop();
      } else {
        spdlog::warn("second signal {}: exiting now without draining", sig);
        std::_Exit(1);
      }
    }
  });
  s = worker->Run();
  finished.store(true);
  watcher.join();
  if (!s.ok()) {
    spdlog::critical("ferry-worker: {}", s.ToString());
    return 1;
  }
  return 0;
}
