// runtime::KeepFreedMemory: after it, a thread that allocates, fills and frees blocks of tens of
// MB (a batch's activations, a chunk of image jobs) gets its pages from the heap again instead
// of faulting fresh ones in; an operator's own malloc settings are left alone. Each case runs
// in a forked child, since malloc's settings are process-wide and fixed once threads exist.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/runtime/malloc_policy.h"

namespace ferry::runtime {
namespace {

constexpr size_t kBlock = size_t{25} << 20;  // ~ one ResNet-18 activation at batch 8
constexpr int kRounds = 20;
constexpr long kPagesTouched = 2L * kRounds * static_cast<long>(kBlock / 4096);

long ThreadFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Minor page faults of a new thread that allocates, fills and frees two blocks per round (the
// first round, which maps the memory, not counted).
long ChurnFaults() {
  long faults = 0;
  std::thread t([&] {
    for (int round = 0; round <= kRounds; ++round) {
      const long before = ThreadFaults();
      std::vector<char*> blocks;
      for (int i = 0; i < 2; ++i) {
        blocks.push_back(static_cast<char*>(std::malloc(kBlock)));
        std::memset(blocks.back(), round + 1, kBlock);
      }
      for (char* b : blocks) std::free(b);
      if (round > 0) faults += ThreadFaults() - before;
    }
  });
  t.join();
  return faults;
}

struct ChildReport {
  int applied = -1;  // KeepFreedMemory's return value; 2 when it was not called
  long faults = -1;
  char what[200] = {};
};

// Runs `setup`, then KeepFreedMemory if `call` is set, then the churn if `churn` is, in a
// forked child.
template <typename Setup>
ChildReport InChild(Setup setup, bool call, bool churn = true) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    setup();
    ChildReport r;
    r.applied = 2;
    if (call) {
      std::string what;
      r.applied = KeepFreedMemory(&what) ? 1 : 0;
      std::strncpy(r.what, what.c_str(), sizeof(r.what) - 1);
    }
    if (churn) r.faults = ChurnFaults();
    const ssize_t n = write(fds[1], &r, sizeof(r));
    _exit(n == static_cast<ssize_t>(sizeof(r)) ? 0 : 1);
  }
  close(fds[1]);
  ChildReport r;
  EXPECT_EQ(read(fds[0], &r, sizeof(r)), static_cast<ssize_t>(sizeof(r)));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return r;
}

void ClearMallocEnvironment() {
  unsetenv("GLIBC_TUNABLES");
  unsetenv("MALLOC_ARENA_MAX");
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
}

TEST(MallocPolicyTest, FreedBlocksAreReusedWithoutPageFaults) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc malloc only";
#endif
  const ChildReport kept = InChild(ClearMallocEnvironment, /*call=*/true);
  ASSERT_EQ(kept.applied, 1) << kept.what;
  EXPECT_NE(std::string(kept.what).find("keeps freed memory"), std::string::npos) << kept.what;
  const ChildReport plain = InChild(ClearMallocEnvironment, /*call=*/false);
  // With glibc's defaults this pattern faults pages in again (12,800 of 256,000 on Debian 12),
  // with a trim threshold alone all of them; with the policy, (almost) none.
  EXPECT_LT(kept.faults * 100, kPagesTouched)
      << "faults with the policy: " << kept.faults << ", with glibc's defaults: " << plain.faults;
}

TEST(MallocPolicyTest, AnOperatorsMallocSettingsAreLeftAlone) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc malloc only";
#endif
  for (const char* name :
       {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX"}) {
    const ChildReport r = InChild(
        [name] {
          ClearMallocEnvironment();
          setenv(name, "1048576", 1);
        },
        /*call=*/true, /*churn=*/false);
    EXPECT_EQ(r.applied, 0) << name << ": " << r.what;
    EXPECT_NE(std::string(r.what).find("environment"), std::string::npos) << r.what;
  }
  for (const char* tunables : {"glibc.malloc.trim_threshold=1048576",
                               "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.mmap_threshold=1048576",
                               "glibc.malloc.arena_max=4"}) {
    const ChildReport r = InChild(
        [tunables] {
          ClearMallocEnvironment();
          setenv("GLIBC_TUNABLES", tunables, 1);
        },
        /*call=*/true, /*churn=*/false);
    EXPECT_EQ(r.applied, 0) << tunables << ": " << r.what;
  }
  // Tunables about other things are not a malloc choice.
  const ChildReport other = InChild(
      [] {
        ClearMallocEnvironment();
        setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F", 1);
      },
      /*call=*/true, /*churn=*/false);
  EXPECT_EQ(other.applied, 1) << other.what;
}

}  // namespace
}  // namespace ferry::runtime
