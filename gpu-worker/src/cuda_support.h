#pragma once
// The worker's CUDA-only pieces, behind a torch-free interface: one stream per executor from
// the CUDA stream pool, making it current for a batch, and the caching allocator's numbers.
//
// Two implementations: src/cuda_support_cuda.cc (compiled only when libtorch has CUDA) and
// src/cuda_support_none.cc (a no-op fallback for CPU-only libtorch, e.g. Debian's 1.13), so
// that the rest of the worker never needs a CUDA header or an #ifdef.
//
// Thread-safety: every function may be called from any thread; a Stream is used by one
// executor thread at a time.

#include <cstdint>
#include <memory>
#include <string>

namespace ferry::worker::cuda {

// One CUDA stream (opaque). Null pointers mean "no stream": the default (CPU) path.
class Stream;

// True when this build of the worker has CUDA support compiled in.
bool Built();

// A stream from libtorch's pool on device `device_index`; null without CUDA (or on failure,
// logged), in which case work runs on the current stream.
std::shared_ptr<Stream> StreamFromPool(int device_index);

// Makes `stream` the current stream (and its device the current device) on the calling thread
// until the returned guard is destroyed. Returns null (no-op) for a null stream.
std::shared_ptr<void> UseStream(const Stream* stream);

// Waits for everything queued on `stream` (no-op for null).
void Synchronize(const Stream* stream);

// Bytes currently allocated by the CUDA caching allocator on `device_index`; -1 without CUDA.
int64_t AllocatedBytes(int device_index);

// Returns cached, unused device memory to the driver (after an out-of-memory error).
void ReleaseCachedMemory();

// For logs: "stream 3 on cuda:0", or "default stream".
std::string Describe(const Stream* stream);

}  // namespace ferry::worker::cuda
