#include "ferry/runtime/thread_name.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

namespace ferry::runtime {
namespace {

// What the kernel shows for the calling thread: /proc/self/task/TID/comm.
std::string CommOfThisThread() {
  std::ifstream f("/proc/self/task/" + std::to_string(syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

TEST(ThreadName, TheKernelShowsTheName) {
  std::string seen, read_back;
  std::thread([&] {
    NameThisThread("ferry-exec-3");
    seen = CommOfThisThread();
    read_back = ThisThreadName();
  }).join();
  EXPECT_EQ(seen, "ferry-exec-3");
  EXPECT_EQ(read_back, "ferry-exec-3");
}

TEST(ThreadName, LongNamesAreCutAtFifteenBytes) {
  std::string seen;
  std::thread([&] {
    NameThisThread("ferry-executor-number-twelve");
    seen = CommOfThisThread();
  }).join();
  EXPECT_EQ(seen, "ferry-executor-");
}

}  // namespace
}  // namespace ferry::runtime
