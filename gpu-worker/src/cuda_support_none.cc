// The CPU-only build of cuda_support.h: no streams, no allocator. Torch-free.
#include "cuda_support.h"

namespace ferry::worker::cuda {

class Stream {};

bool Built() { return false; }
std::shared_ptr<Stream> StreamFromPool(int) { return nullptr; }
std::shared_ptr<void> UseStream(const Stream*) { return nullptr; }
void Synchronize(const Stream*) {}
int64_t AllocatedBytes(int) { return -1; }
void ReleaseCachedMemory() {}
std::string Describe(const Stream*) { return "default stream"; }

}  // namespace ferry::worker::cuda
