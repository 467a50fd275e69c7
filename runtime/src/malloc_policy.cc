#include "ferry/runtime/malloc_policy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ferry::runtime {

bool KeepFreedMemory(std::string* what, size_t trim_bytes) {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if ((tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) ||
      std::getenv("MALLOC_ARENA_MAX") != nullptr ||
      std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    *what = "malloc settings left as the environment sets them";
    return false;
  }
  const size_t trim = std::min<size_t>(trim_bytes, size_t{1} << 30);
  const struct {
    int param;
    int value;
    const char* name;
  } settings[] = {
      {M_ARENA_MAX, 1, "M_ARENA_MAX"},
      {M_MMAP_THRESHOLD, 32 << 20, "M_MMAP_THRESHOLD"},  // glibc's largest on 64-bit
      {M_TRIM_THRESHOLD, static_cast<int>(trim), "M_TRIM_THRESHOLD"},
  };
  for (const auto& s : settings) {
    if (mallopt(s.param, s.value) != 1) {
      *what = std::string("malloc: mallopt(") + s.name +
              ") refused; the settings before it in (M_ARENA_MAX, M_MMAP_THRESHOLD, "
              "M_TRIM_THRESHOLD) apply, the rest are glibc's defaults";
      return false;
    }
  }
  *what = "malloc keeps freed memory (one arena, mmap threshold 32 MiB, trim threshold " +
          std::to_string(trim >> 20) + " MiB)";
  return true;
#else
  (void)trim_bytes;
  *what = "malloc settings left alone (not glibc)";
  return false;
#endif
}

}  // namespace ferry::runtime
