#pragma once
// How Ferry's servers ask the C library's allocator to treat big buffers (glibc malloc).

#include <cstddef>
#include <string>

namespace ferry::runtime {

inline constexpr size_t kKeepFreedBytes = size_t{128} << 20;  // 128 MiB

// Keeps freed memory in the process for reuse instead of giving it back to the kernel. Called
// at the top of main(), before any thread starts (M_ARENA_MAX binds threads created after it),
// by ferry-broker, ferry-worker and ferry-bench --raw; not by the SDK (a producer's process is
// the producer's to tune).
//
// With glibc's defaults, an allocation above the mmap threshold (128 KiB at first, raised to
// the size of each such block freed) is a fresh mmap; a heap's free top beyond the trim
// threshold (twice that) goes back to the kernel; and each thread's arena lives in 64 MiB
// heaps, which hold at most two 25 MB blocks. A process that moves messages of several MB (the
// broker with 602 KB image jobs in 4.8 MB chunks) or allocates tens of MB per batch (a worker's
// ResNet activations) therefore keeps getting fresh pages, which the kernel zero-fills on first
// touch: 689 page faults per 602 KB job in the broker, 2,060 per job in a two-executor ResNet-18
// worker -- on a virtual machine, more time than moving the bytes or, for the raw model, half
// of its time (docs/performance.md, step 13).
//
// Sets M_ARENA_MAX 1 (every thread allocates from the main heap, which grows without a 64 MiB
// bound), M_MMAP_THRESHOLD 32 MiB (glibc's largest) and M_TRIM_THRESHOLD trim_bytes: blocks up
// to 32 MiB come from the heap and up to trim_bytes of free heap stay mapped (the process's
// resident memory stays near its peak; ~50 MB more in the measurements of step 13). Blocks
// above 32 MiB -- a CPU worker's ResNet activations at batch 32 (~100 MB) -- are still fresh
// mappings each time. One arena was measured on 2 cores only; on a many-core host with many
// executors an operator who sees malloc contention can set MALLOC_ARENA_MAX (which turns
// all of this off, see below).
// Does nothing when the operator chose already -- GLIBC_TUNABLES naming any glibc.malloc.*
// tunable, or MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ set -- or with
// a C library other than glibc. Returns true when it set
// them; *what says what happened, for the log.
bool KeepFreedMemory(std::string* what, size_t trim_bytes = kKeepFreedBytes);

}  // namespace ferry::runtime
