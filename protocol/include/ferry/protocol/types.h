#pragma once
// The decoded forms of wire protocol v1's message bodies and of the Redis result record, as
// plain structs: what the broker, the worker and the SDK hold in memory. No msgpack, no
// ZeroMQ: the encoders and decoders are in messages.h (docs/protocol.md is the prose version).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/tensor.h"

namespace ferry::protocol {

// Limits every decoder applies.
inline constexpr size_t kMaxTensorDims = 16;
inline constexpr size_t kMaxInputsPerJob = 64;
inline constexpr size_t kMaxModelName = 128;

// Job ids: 1-128 characters of [A-Za-z0-9._:-].
bool IsValidJobId(std::string_view id);

// A tensor whose bytes live in a received buffer (not owned). A stored input (`stored`: the
// producer put its bytes in Redis under Keys::Input, the message carries only dtype and shape)
// has `size` from its dtype and shape and `data` null until a worker has fetched the bytes. An
// attached input (`attached`: its bytes are a ZeroMQ frame of their own after the body) has
// `size` from its dtype and shape and `data` null until the frame is matched to it
// (MatchFrames in wire.h, docs/protocol.md "Attached inputs").
struct TensorRef {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  size_t size = 0;
  bool stored = false;
  bool attached = false;
};

// ---- ACCEPTED {"ids": [...], "rejected": [{"id","code","message"}], "rid"?} ------------------
struct Rejection {
  std::string id;
  std::string code;
  std::string message;
};
struct Accepted {
  int64_t rid = 0;
  std::vector<std::string> ids;
  std::vector<Rejection> rejected;
};

// ---- DONE and FINISHED --------------------------------------------------------------------
// DONE's "not_done" {id: status}: the final status of those ids whose result is not "done"
// ("failed", "expired", "cancelled"), for the broker's metrics.
using DoneStatuses = std::vector<std::pair<std::string, std::string>>;  // id, status
// "results" {id: bin} (DONE and FINISHED): small results inline, each the exact bytes of the
// job's Redis result record, so that the submitting producer can return them without reading
// Redis. Only results the writer's SET NX actually stored are inlined. Views into a buffer.
using InlineResults = std::vector<std::pair<std::string_view, std::string_view>>;  // id, record

// ---- LIMITS {"rid"?} -> LIMITS {"max_message_bytes", "max_job_bytes", ...} ------------------
// What the broker's frontend takes (--max-message-bytes, --max-job-bytes,
// --max-jobs-per-message). Clients ask on every new connection, before sending anything else.
struct BrokerLimits {
  int64_t max_message_bytes = 0;
  int64_t max_job_bytes = 0;
  int64_t max_jobs_per_message = 0;
};

// ---- CANCEL {"ids": [...], "rid"?} -> CANCELLED {"ids", "running", "not_found", "rid"?} ------
struct Cancelled {
  int64_t rid = 0;
  std::vector<std::string> ids;        // were queued: now cancelled (final status "cancelled")
  std::vector<std::string> running;    // were dispatched: the worker drops them if it still can
  std::vector<std::string> not_found;  // not pending: unknown, or already finished
};

// ---- READY (worker -> broker) -------------------------------------------------------------
// A model's declared input (READY "inputs", from the worker's model repository file): the dtype
// and the shape of one job input, without the batch dimension; -1 in `shape` matches any size.
// `name` is optional (messages and `ferry models` show it).
struct InputSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  bool operator==(const InputSpec& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape;
  }
};
struct ModelInfo {
  std::string name;
  int64_t max_batch = 1;
  // Optional: the job inputs the model takes, in order. Absent (nullopt): not declared, the
  // broker accepts any inputs.
  std::optional<std::vector<InputSpec>> inputs;
};
struct WorkerHello {
  std::string worker;  // a name unique in the fleet, e.g. host:pid:device
  std::string device;
  std::string host;
  int64_t pid = 0;
  int64_t capacity = 0;  // jobs the worker can hold at once (its credit when idle)
  std::vector<ModelInfo> models;
  // Optional "resident": the models loaded and warm on the worker (a subset of `models`); a
  // broker prefers such a worker for their jobs. Absent (nullopt): every model counts as warm.
  std::optional<std::vector<std::string>> resident;
  // Optional "held": the ids of the jobs the worker holds from CHUNKs it received and has not
  // yet reported in a DONE (at most `capacity`). After a broker restart, or after the broker
  // dropped the worker as silent, the broker leaves those jobs with it instead of sending them
  // elsewhere. Empty: none (omitted on the wire).
  std::vector<std::string> held;
  // Optional "heartbeat_ms": how often the worker sends HEARTBEAT (its --heartbeat-ms). The
  // broker presumes it dead only after --liveness of the longer of that and its own interval.
  // 0: not said (omitted on the wire): the broker's own interval.
  int64_t heartbeat_ms = 0;
  // Optional "redis_prefix": the prefix of the Redis keys the worker reads and writes (its
  // --redis-prefix). The broker refuses a READY whose prefix is not its own: the worker would
  // write results where no producer reads them. nullopt: not said (omitted on the wire); an
  // empty prefix is said, and checked, as any other.
  std::optional<std::string> redis_prefix;
};
// The heartbeat intervals a peer may announce (READY's, HEARTBEAT's "heartbeat_ms"), as the
// broker's and the worker's --heartbeat-ms take.
inline constexpr int64_t kMinHeartbeatMs = 10;
inline constexpr int64_t kMaxHeartbeatMs = 600000;

// ---- CHUNK (broker -> worker) {"jobs": [entry, ...]} ---------------------------------------
// An entry: id, model, inputs, attempt, priority, result_ttl_s, submitted, dispatched, deadline
// (wall-clock us by which the job must start; 0 = none), and "notify" (optional: the submitting
// producer's Pub/Sub channel, see Keys::NotifyChannel).
struct ChunkJob {
  std::string id;
  std::string model;
  std::vector<TensorRef> inputs;
  int64_t attempt = 1;
  int64_t priority = 0;
  int64_t result_ttl_s = 0;
  int64_t submitted_us = 0;
  int64_t dispatched_us = 0;
  int64_t deadline_us = 0;
  std::string notify;  // empty = none
  // The indexes of the inputs stored in Redis (Keys::Input), kept when `inputs` is released:
  // whoever writes the job's final result deletes them.
  std::vector<int32_t> stored_inputs;
};

// ---- Result record (Redis value) ------------------------------------------------------------
struct ResultRecord {
  std::string_view id;
  std::string_view status;  // "done" | "failed" | "cancelled" | "expired"
  std::string_view model;
  std::string_view worker;
  std::vector<TensorRef> outputs;  // when done
  std::string error_code;          // otherwise
  std::string error_message;
  int64_t batch_size = 0;
  int64_t attempt = 0;
  std::map<std::string, int64_t> timing_us;
};

}  // namespace ferry::protocol
