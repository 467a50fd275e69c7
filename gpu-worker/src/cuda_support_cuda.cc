// The CUDA build of cuda_support.h; compiled only when libtorch has CUDA (see CMakeLists.txt).
// Uses only APIs present in both libtorch 1.13 and 2.x: getStreamFromPool(bool, DeviceIndex),
// CUDAStreamGuard, getDeviceStats(device).allocated_bytes[0] (index 0 = aggregate), emptyCache.
#include "cuda_support.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>

#include <exception>

namespace ferry::worker::cuda {

class Stream {
 public:
  explicit Stream(c10::cuda::CUDAStream s) : stream(s) {}
  c10::cuda::CUDAStream stream;
};

bool Built() { return true; }

std::shared_ptr<Stream> StreamFromPool(int device_index) {
  try {
    return std::make_shared<Stream>(c10::cuda::getStreamFromPool(
        /*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device_index)));
  } catch (const std::exception& e) {
    spdlog::warn("no CUDA stream from the pool on device {}: {}; using the current stream",
                 device_index, e.what());
    return nullptr;
  }
}

std::shared_ptr<void> UseStream(const Stream* stream) {
  if (stream == nullptr) return nullptr;
  try {
    return std::make_shared<c10::cuda::CUDAStreamGuard>(stream->stream);
  } catch (const std::exception& e) {
    spdlog::warn("cannot make {} current: {}", Describe(stream), e.what());
    return nullptr;
  }
}

void Synchronize(const Stream* stream) {
  if (stream == nullptr) return;
  try {
    stream->stream.synchronize();
  } catch (const std::exception& e) {
    spdlog::warn("synchronize {}: {}", Describe(stream), e.what());
  }
}

int64_t AllocatedBytes(int device_index) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device_index));
    return static_cast<int64_t>(stats.allocated_bytes[0].current);  // [0]: StatType::AGGREGATE
  } catch (const std::exception&) {
    // Before the first CUDA allocation the caching allocator is not initialised and throws:
    // nothing is allocated yet on a device that exists.
    return device_index >= 0 && device_index < static_cast<int>(c10::cuda::device_count()) ? 0 : -1;
  }
}

void ReleaseCachedMemory() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const std::exception& e) {
    spdlog::warn("emptyCache: {}", e.what());
  }
}

std::string Describe(const Stream* stream) {
  if (stream == nullptr) return "default stream";
  return "stream " + std::to_string(stream->stream.id()) +
         " on cuda:" + std::to_string(static_cast<int>(stream->stream.device_index()));
}

}  // namespace ferry::worker::cuda
