// ferry-worker: parse flags, Create (load the models), Run until SIGTERM/SIGINT has drained.
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <thread>

#include "ferry/runtime/logging.h"
#include "ferry/runtime/malloc_policy.h"
#include "ferry/runtime/thread_name.h"
#include "ferry/worker/options.h"
#include "ferry/worker/worker.h"

// GCC says -fsanitize=address with __SANITIZE_ADDRESS__, clang (before 17) with __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_CLANG_ASAN 1
#endif
#endif
#ifndef FERRY_CLANG_ASAN
#define FERRY_CLANG_ASAN 0
#endif

namespace {

// CPU inference: OpenMP threads that spin in their barriers fight the worker's own I/O and result
// threads (and, on a small host, the broker and Redis) for cores; with a passive wait policy the
// fleet keeps up with the model run alone (docs/performance.md). libgomp reads OMP_WAIT_POLICY
// once, when it is loaded -- before main() -- so setting it here takes a re-exec. An explicit
// OMP_WAIT_POLICY (e.g. ACTIVE) is left alone. Irrelevant to CUDA kernels. The binary is
// re-executed by its real path: the kernel names a process after the file it executes, and a
// worker named "exe" is one that pgrep, ps -C and killall do not find.
void ReexecWithPassiveOpenMp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) {
    path[n] = '\0';
    execv(path, argv);
  }
  execv("/proc/self/exe", argv);  // returns only on failure: go on with the default policy
  std::fprintf(stderr, "ferry-worker: could not re-exec with OMP_WAIT_POLICY=PASSIVE\n");
}

// Ends the process once our own objects are gone, without the libraries' static destructors:
// CUDA libtorch's (the pinned-memory cache's thread, handle pools) may run after the CUDA driver
// has gone, and a GPU test binary that had passed every test crashed there (H200, torch 2.11
// cu130; docs/gpu.md). Nothing of ours is left to flush but the logs (spdlog's synchronous
// default logger). Under AddressSanitizer it returns, so that the leak check at exit still runs.
int Leave(int rc) {
  spdlog::shutdown();
  std::fflush(nullptr);
#if !defined(__SANITIZE_ADDRESS__) && !FERRY_CLANG_ASAN
  std::_Exit(rc);
#endif
  return rc;
}

// The configuration's fault -- a CURVE key it cannot read, a model repository entry, a READY
// the broker would refuse -- exits 2, as a bad flag does, and is not restarted
// (RestartPreventExitStatus=2); Redis, a device or a model file not there now exits 1.
int ExitCode(const ferry::Status& s) {
  if (s.ok()) return 0;
  return s.code() == ferry::codes::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ReexecWithPassiveOpenMp(argv);
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
  ferry::logging::Configure(options.log_level, options.log_json, "worker");  // level checked
  ferry::logging::SetProcessField("worker", options.name);                   // on every JSON line
  std::string malloc_policy;
  ferry::runtime::KeepFreedMemory(&malloc_policy);  // big jobs and batches: fewer page faults
  spdlog::info("{}", malloc_policy);

  // SIGINT/SIGTERM are blocked in every thread (they inherit the mask) and taken by sigtimedwait
  // below, so that a signal becomes an orderly drain instead of a handler racing the threads.
  // SIGHUP too, which a worker has nothing to reload for: by default it would end the worker
  // without a drain (a closed ssh session, a `kill -HUP` meant for the broker's keys).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<Worker> worker;
  s = Worker::Create(options, &worker);
  if (!s.ok()) {
    spdlog::critical("ferry-worker: {}", s.ToString());
    return Leave(ExitCode(s));  // a model may have been loaded on the GPU before the failure
  }

  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    ferry::runtime::NameThisThread("ferry-signals");
    int received = 0;
    while (!finished.load()) {
      timespec tick{0, 100 * 1000 * 1000};
      int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig <= 0) continue;
      if (sig == SIGHUP) {
        spdlog::info("SIGHUP: nothing to reload (a worker reads its flags and models at start)");
        continue;
      }
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
  worker.reset();  // our own teardown, in order: executors, models, streams, connections
  if (!s.ok()) spdlog::critical("ferry-worker: {}", s.ToString());
  return Leave(ExitCode(s));
}
