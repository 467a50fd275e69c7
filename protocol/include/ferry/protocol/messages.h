#pragma once
// Encoders and decoders for each message body of wire protocol v1 and for the result record in
// Redis. docs/protocol.md is the prose version of this file; keep them in step.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/codec.h"
#include "ferry/result.h"

namespace ferry::protocol {

// Job ids: 1-128 characters of [A-Za-z0-9._:-].
bool IsValidJobId(std::string_view id);
inline constexpr size_t kMaxModelName = 128;

// ---- SUBMIT {"jobs": [job, ...], "rid"?: int} ----------------------------------------------
struct SubmitJob {
  std::string id;
  std::string model;
  int64_t priority = 0;
  int64_t timeout_ms = 0;    // 0 = none
  int64_t result_ttl_s = 0;  // 0 = the broker's default
  std::vector<TensorRef> inputs;
  const msgpack::object* inputs_obj = nullptr;  // the raw "inputs" array, for re-packing
};
// Decodes and validates one job map. On failure `out->id` holds the id when it could be read.
Status DecodeSubmitJob(const msgpack::object& o, SubmitJob* out);
void PackSubmitJob(Packer& pk, std::string_view id, std::string_view model,
                   const std::vector<Tensor>& inputs, int64_t priority, int64_t timeout_ms,
                   int64_t result_ttl_s);

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
zmq::message_t EncodeAccepted(const Accepted& a);
Status DecodeAccepted(const msgpack::object& body, Accepted* out);

// ---- ERROR {"code", "message", "rid"?} -----------------------------------------------------
zmq::message_t EncodeError(int64_t rid, std::string_view code, std::string_view message);
Status DecodeError(const msgpack::object& body, Status* out);

// ---- a body of just {"ids": [...], "rid"?} (DONE, FINISHED) and the empty body -------------
zmq::message_t EncodeIds(const std::vector<std::string>& ids, int64_t rid = 0);
// DONE {"ids": [...], "duplicates": n}: n of those ids already had a final result in Redis
// (fencing: the first result wins); "duplicates" is left out when 0.
// "not_done" {id: status} (left out when empty) gives the final status of those ids whose
// result is not "done" ("failed", "expired", "cancelled"), for the broker's metrics.
using DoneStatuses = std::vector<std::pair<std::string, std::string>>;  // id, status
// "results" {id: bin} (DONE and FINISHED; left out when empty): small results inline, each the
// exact bytes of the job's Redis result record, so that the submitting producer can return them
// without reading Redis. Only results this writer's SET NX actually stored are inlined.
using InlineResults = std::vector<std::pair<std::string_view, std::string_view>>;  // id, record
// "notified" [id, ...] (left out when empty): the ids whose result notice the worker published
// on the job's "notify" channel (only for results its SET NX stored); the broker sends no
// FINISHED for them.
zmq::message_t EncodeDone(const std::vector<std::string>& ids, int64_t duplicates,
                          const DoneStatuses& not_done = {}, const InlineResults& results = {},
                          const std::vector<std::string>& notified = {});
// Reads DONE's optional "not_done" map into *out (cleared first; empty when absent).
Status DecodeDoneStatuses(const msgpack::object& body, DoneStatuses* out);
// Reads DONE's optional "notified" array into *out (cleared first; empty when absent).
Status DecodeDoneNotified(const msgpack::object& body, std::vector<std::string>* out);
// FINISHED {"ids": [...], "results"?: {id: bin}}. A worker's result notice on a producer's
// notify channel has the same body.
zmq::message_t EncodeFinished(const std::vector<std::string>& ids, const InlineResults& results);
// Reads the optional "results" map of DONE or FINISHED into *out (cleared first). The views
// point into `body`'s buffer.
Status DecodeInlineResults(const msgpack::object& body, InlineResults* out);

// ---- CANCEL {"ids": [...], "rid"?} -> CANCELLED {"ids", "running", "not_found", "rid"?} ------
struct Cancelled {
  int64_t rid = 0;
  std::vector<std::string> ids;        // were queued: now cancelled (final status "cancelled")
  std::vector<std::string> running;    // were dispatched: the worker drops them if it still can
  std::vector<std::string> not_found;  // not pending: unknown, or already finished
};
zmq::message_t EncodeCancelled(const Cancelled& c);
Status DecodeCancelled(const msgpack::object& body, Cancelled* out);
zmq::message_t EncodeEmpty(int64_t rid = 0);

// ---- READY (worker -> broker) -------------------------------------------------------------
struct ModelInfo {
  std::string name;
  int64_t max_batch = 1;
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
};
zmq::message_t EncodeHello(const WorkerHello& h);
Status DecodeHello(const msgpack::object& body, WorkerHello* out);

// ---- CHUNK (broker -> worker) {"jobs": [entry, ...]} ---------------------------------------
// An entry is a map: id, model, inputs, attempt, priority, result_ttl_s, submitted, dispatched,
// deadline (wall-clock us by which the job must start; 0 = none), and "notify" (optional: the
// submitting producer's Pub/Sub channel, see Keys::NotifyChannel).
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
};
// Packs one entry; `inputs_raw` is the msgpack encoding of the inputs array. An empty `notify`
// is left out.
void PackChunkEntry(Packer& pk, std::string_view id, std::string_view model,
                    std::string_view inputs_raw, int64_t attempt, int64_t priority,
                    int64_t result_ttl_s, int64_t submitted_us, int64_t dispatched_us,
                    int64_t deadline_us = 0, std::string_view notify = {});
Status DecodeChunkEntry(const msgpack::object& o, ChunkJob* out);
// Re-encodes `o` (e.g. a received job's "inputs") straight into *out, replacing it, after
// reserving `size_hint` bytes (e.g. the tensor bytes plus ~64 per tensor): the bytes are copied
// once, with no intermediate buffer.
void PackObjectInto(const msgpack::object& o, size_t size_hint, std::string* out);

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
void PackResult(Packer& pk, const ResultRecord& r);
Status DecodeResult(const void* data, size_t size, Result* out);

}  // namespace ferry::protocol
