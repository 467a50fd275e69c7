// SampleProcessMetrics: the process_* series every Prometheus client library exports, from
// getrusage, /proc/self/stat, /proc/self/fd and getrlimit.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"

namespace ferry::metrics::names {
namespace {

// CPU seconds (user + system) from getrusage: microseconds, where /proc/self/stat counts clock
// ticks (10 ms), and an idle broker just started read 0 there.
bool ReadCpu(double* cpu_seconds) {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return false;
  *cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                 static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  return true;
}

// rss (bytes) from /proc/self/stat; false when it cannot be read.
bool ReadRss(double* rss_bytes) {
  FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return false;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Field 2, the command, is in parentheses and may hold spaces: parse after the last ')'.
  std::string s(buf, n);
  size_t close = s.rfind(')');
  if (close == std::string::npos) return false;
  long rss = 0;
  // Fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice threads itrealvalue starttime vsize rss
  int got = std::sscanf(s.c_str() + close + 1,
                        " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                        "%*d %*d %*u %*u %ld",
                        &rss);
  if (got != 1) return false;
  *rss_bytes = static_cast<double>(rss) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return true;
}

int CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

void SampleProcessMetrics(Registry* registry) {
  static std::mutex mu;  // the CPU counter's read-then-add must not interleave
  std::lock_guard<std::mutex> lock(mu);
  double cpu = 0, rss = 0;
  if (ReadCpu(&cpu)) {
    metrics::Counter* c = registry->Counter(kProcessCpu, kProcessCpuHelp);
    c->Add(cpu - c->Value());  // a counter only goes up; Add ignores a negative step
  }
  if (ReadRss(&rss)) registry->Gauge(kProcessRss, kProcessRssHelp)->Set(rss);
  if (int fds = CountOpenFds(); fds >= 0)
    registry->Gauge(kProcessOpenFds, kProcessOpenFdsHelp)->Set(fds);
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    registry->Gauge(kProcessMaxFds, kProcessMaxFdsHelp)->Set(static_cast<double>(lim.rlim_cur));
}

}  // namespace ferry::metrics::names
