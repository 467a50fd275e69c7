#pragma once
// What a READY may announce: the broker refuses any other with ERROR invalid_argument, and a
// worker checks its own before it starts (a refused READY would leave it idle for good).

#include <cstddef>
#include <cstdint>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::protocol {

inline constexpr size_t kMaxModelsPerWorker = 256;
inline constexpr int64_t kMaxWorkerCapacity = 1 << 16;  // jobs a worker holds at once
inline constexpr int64_t kMaxModelBatch = 1 << 16;

// ok, or invalid_argument naming the first field out of bounds: the worker's name, device and
// host (printable, at most 128, 64 and 255 characters), its capacity (1..kMaxWorkerCapacity),
// 1..kMaxModelsPerWorker models with names of 1-128 characters of [A-Za-z0-9._:/-], each once,
// max_batch 1..kMaxModelBatch, input names of 1-64 characters of [A-Za-z0-9._-], "resident"
// naming only announced models, heartbeat_ms 0 (not said) or kMin..kMaxHeartbeatMs, and
// redis_prefix at most 1024 bytes.
Status CheckHello(const WorkerHello& h);

}  // namespace ferry::protocol
