// The daemons' cached getpid() (protocol/src/pid_cache.cc), linked into this test binary the same
// way: it interposes the C library's, agrees with the kernel, and a forked child sees its own pid.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

pid_t KernelPid() { return static_cast<pid_t>(syscall(SYS_getpid)); }

TEST(PidCache, AgreesWithTheKernel) {
  EXPECT_EQ(getpid(), KernelPid());
  EXPECT_EQ(getpid(), KernelPid());  // the cached answer
}

TEST(PidCache, InterposesForSharedLibraries) {
  // What a shared library (libzmq) binds to when it calls getpid: the executable's definition.
  void* seen_by_libraries = dlsym(RTLD_DEFAULT, "getpid");
  ASSERT_NE(seen_by_libraries, nullptr);
  EXPECT_EQ(seen_by_libraries, reinterpret_cast<void*>(&getpid));
  void* libc = dlsym(RTLD_NEXT, "getpid");
  EXPECT_NE(libc, reinterpret_cast<void*>(&getpid)) << "the C library's own is a different one";
}

TEST(PidCache, ForkedChildSeesItsOwnPid) {
  const pid_t parent = getpid();  // cached now
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit status 0 only when the child's getpid is its own, not the parent's cached one.
    _exit(getpid() == KernelPid() && getpid() != parent ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(getpid(), parent);
}

}  // namespace
