#include "ferry/runtime/thread_name.h"

#include <pthread.h>

namespace ferry::runtime {

namespace {
constexpr size_t kMaxName = 15;  // TASK_COMM_LEN (16) less the terminating NUL
}  // namespace

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, kMaxName).c_str());
}

std::string ThisThreadName() {
  char buf[kMaxName + 1] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof buf) != 0) return "";
  return buf;
}

}  // namespace ferry::runtime
