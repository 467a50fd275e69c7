#pragma once
// How Ferry's servers ask the C library's allocator to treat big buffers (glibc malloc).

#include <cstddef>
#include <string>

namespace ferry::runtime {

inline constexpr size_t kKeepFreedBytes = size_t{128} << 20;  // 128 MiB

// Keeps freed memory in the process for reuse instead of giving it back to the kernel, so that
// big buffers (multi-MB chunks in the broker, batch activations in a worker) are not page-faulted
// in afresh each time. Call at the top of main(), before any thread starts. Used by
// ferry-broker, ferry-worker and ferry-bench --raw; not by the SDK (a producer's process is the
// producer's to tune). Sets M_ARENA_MAX 1, M_MMAP_THRESHOLD 32 MiB and M_TRIM_THRESHOLD
// trim_bytes; blocks above 32 MiB are still fresh mappings. Does nothing when the operator chose
// already (GLIBC_TUNABLES naming a glibc.malloc.* tunable, or MALLOC_ARENA_MAX,
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ set) or with a C library other than glibc.
// Returns true when it set them; *what says what happened, for the log.
// Why and what it costs: docs/performance.md#the-servers-keep-freed-memory.
bool KeepFreedMemory(std::string* what, size_t trim_bytes = kKeepFreedBytes);

}  // namespace ferry::runtime
