#pragma once
// Encoders and decoders for each message body of wire protocol v1 and for the result record in
// Redis; the structs they fill are in types.h. docs/protocol.md is the prose version of this
// file; keep them in step.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/types.h"
#include "ferry/result.h"

namespace ferry::protocol {

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
// Decodes and validates one job map (inputs may be stored). On failure `out->id` holds the id
// when it could be read.
Status DecodeSubmitJob(const msgpack::object& o, SubmitJob* out);
// `stored[i]` (when given): input i's bytes are in Redis (Keys::Input(id, i)); only its dtype
// and shape are packed. `attached[i]` (when given, and not stored): input i's bytes are sent
// as a data frame of the message, by the caller, in the order of the attached inputs.
void PackSubmitJob(Packer& pk, std::string_view id, std::string_view model,
                   const std::vector<Tensor>& inputs, int64_t priority, int64_t timeout_ms,
                   int64_t result_ttl_s, const std::vector<bool>& stored = {},
                   const std::vector<bool>& attached = {});
// The indexes of the stored inputs among `inputs`.
std::vector<int32_t> StoredInputs(const std::vector<TensorRef>& inputs);

// ---- ACCEPTED, ERROR ------------------------------------------------------------------------
zmq::message_t EncodeAccepted(const Accepted& a);
Status DecodeAccepted(const msgpack::object& body, Accepted* out);
// ERROR {"code", "message", "rid"?}
zmq::message_t EncodeError(int64_t rid, std::string_view code, std::string_view message);
Status DecodeError(const msgpack::object& body, Status* out);

// ---- LIMITS {"max_message_bytes", "max_job_bytes", "max_jobs_per_message", "rid"?} ---------
zmq::message_t EncodeLimits(const BrokerLimits& limits, int64_t rid);
// invalid_argument unless max_message_bytes is at least 1024 (the broker's minimum) and
// max_jobs_per_message at least 1; max_job_bytes is optional (0 when absent).
Status DecodeLimits(const msgpack::object& body, BrokerLimits* out);

// ---- a body of just {"ids": [...], "rid"?} and the empty body ------------------------------
zmq::message_t EncodeIds(const std::vector<std::string>& ids, int64_t rid = 0);
zmq::message_t EncodeEmpty(int64_t rid = 0);

// ---- HEARTBEAT {"heartbeat_ms"?} ---------------------------------------------------------------
// Either side's heartbeat interval, so that the other presumes it dead only after --liveness of
// the longer of the two intervals (a worker says it in READY, the broker in its HEARTBEATs).
zmq::message_t EncodeHeartbeat(int64_t heartbeat_ms);
// The interval a HEARTBEAT body says; 0 when it says none, or one out of kMin..kMaxHeartbeatMs.
int64_t DecodeHeartbeat(const zmq::message_t& body);

// ---- DONE {"ids", "duplicates"?, "not_done"?, "results"?, "notified"?, "bye"?} -------------
// "duplicates": how many of the ids already had a final result in Redis (fencing: the first
// result wins); left out when 0. "not_done", "results": see types.h. "notified" [id, ...]: the
// ids whose result notice the worker published on the job's "notify" channel (only for results
// its SET NX stored); the broker sends no FINISHED for them. "bye": true on a draining worker's
// last DONE: the broker removes the worker as it finishes the jobs, so the credit they return
// is never used for new work. Empty parts (and a false "bye") are left out.
zmq::message_t EncodeDone(const std::vector<std::string>& ids, int64_t duplicates,
                          const DoneStatuses& not_done = {}, const InlineResults& results = {},
                          const std::vector<std::string>& notified = {}, bool bye = false);
// Reads DONE's optional "not_done" map into *out (cleared first; empty when absent).
Status DecodeDoneStatuses(const msgpack::object& body, DoneStatuses* out);
// Reads DONE's optional "notified" array into *out (cleared first; empty when absent).
Status DecodeDoneNotified(const msgpack::object& body, std::vector<std::string>* out);

// ---- FINISHED {"ids": [...], "results"?: {id: bin}} -----------------------------------------
// A worker's result notice on a producer's notify channel has the same body.
zmq::message_t EncodeFinished(const std::vector<std::string>& ids, const InlineResults& results);
// Reads the optional "results" map of DONE or FINISHED into *out (cleared first). The views
// point into `body`'s buffer.
Status DecodeInlineResults(const msgpack::object& body, InlineResults* out);

// ---- CANCEL / CANCELLED ---------------------------------------------------------------------
zmq::message_t EncodeCancelled(const Cancelled& c);
Status DecodeCancelled(const msgpack::object& body, Cancelled* out);

// ---- READY ----------------------------------------------------------------------------------
// A model entry is {"name", "max_batch", "inputs"?: [{"name"?, "dtype", "shape"}]}. The decoder
// checks the structure of "inputs" (at most kMaxInputsPerJob entries, known dtypes, at most
// kMaxTensorDims dims, each >= -1); the names and the rest: CheckHello (hello_check.h).
zmq::message_t EncodeHello(const WorkerHello& h);
Status DecodeHello(const msgpack::object& body, WorkerHello* out);
// The "inputs" array of a READY model entry (also STATS' "models"); `out` is cleared first.
void PackInputSpecs(Packer& pk, const std::vector<InputSpec>& specs);
Status DecodeInputSpecs(const msgpack::object& o, std::vector<InputSpec>* out);

// ---- CHUNK entries --------------------------------------------------------------------------
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
void PackResult(Packer& pk, const ResultRecord& r);
Status DecodeResult(const void* data, size_t size, Result* out);
// The same from a record this call may take: its largest output of at least 64 KiB keeps the
// record's buffer (its bytes moved to the front, no new allocation: a fresh ~1 MB buffer is
// page-faulted in afresh, docs/performance.md "Big results written plain, read once").
Status DecodeResult(std::string&& record, Result* out);

}  // namespace ferry::protocol
