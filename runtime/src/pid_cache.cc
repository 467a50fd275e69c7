// getpid() with a cache, linked into Ferry's own executables (ferry-broker, ferry-worker,
// ferry-bench, ferry) only.
//
// libzmq calls getpid() in every mailbox operation to notice that it runs in a forked child
// (signaler.cpp), and glibc no longer caches it: each call is a system call, tens per job at light
// load (docs/performance.md#cached-getpid-and-fewer-system-calls).
//
// A definition in the executable interposes the C library's for every shared library the process
// loads (ELF symbol lookup searches the executable first). The cache is cleared in a forked child
// (pthread_atfork), so libzmq's fork detection keeps working; exec starts a fresh image. The SDK
// library does not do this: the process it lives in belongs to the producer, who may opt in by
// linking this file (or ferry::pid_cache) into their executable.

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace {

std::atomic<pid_t> g_pid{0};

void ForgetPidInChild() { g_pid.store(0, std::memory_order_relaxed); }

}  // namespace

extern "C" pid_t getpid(void) noexcept {
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  static const int registered = pthread_atfork(nullptr, nullptr, ForgetPidInChild);
  (void)registered;
  pid = static_cast<pid_t>(syscall(SYS_getpid));
  g_pid.store(pid, std::memory_order_relaxed);
  return pid;
}
