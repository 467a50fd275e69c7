#include "ferry/protocol/messages.h"

#include "ferry/protocol/keys.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

// Adds "rid" to a map when non-zero; returns the number of extra entries.
uint32_t RidEntries(int64_t rid) { return rid != 0 ? 1 : 0; }
void PackRid(Packer& pk, int64_t rid) {
  if (rid == 0) return;
  PackString(pk, "rid");
  pk.pack_int64(rid);
}

}  // namespace

bool IsValidJobId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool Keys::IsNotifyChannel(std::string_view channel) const {
  const std::string head = prefix_ + "notify:";
  return channel.size() > head.size() && channel.substr(0, head.size()) == head &&
         IsValidJobId(channel.substr(head.size()));
}

Status DecodeSubmitJob(const msgpack::object& o, SubmitJob* out) {
  out->id.clear();
  if (o.type != msgpack::type::MAP) return Status::InvalidArgument("a job must be a map");
  if (const msgpack::object* id = Find(o, "id"); id && id->type == msgpack::type::STR)
    out->id.assign(id->via.str.ptr, std::min<size_t>(id->via.str.size, 256));
  if (!IsValidJobId(out->id))
    return Status::InvalidArgument("job \"id\" must be 1-128 characters of [A-Za-z0-9._:-]");
  FERRY_RETURN_IF_ERROR(GetString(o, "model", &out->model));
  if (out->model.empty() || out->model.size() > kMaxModelName)
    return Status::InvalidArgument("job \"model\" must be 1-128 characters");
  FERRY_RETURN_IF_ERROR(GetInt(o, "priority", &out->priority, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "timeout_ms", &out->timeout_ms, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "result_ttl_s", &out->result_ttl_s, 0));
  if (out->timeout_ms < 0) return Status::InvalidArgument("\"timeout_ms\" must be >= 0");
  if (out->result_ttl_s < 0) return Status::InvalidArgument("\"result_ttl_s\" must be >= 0");
  out->inputs_obj = Find(o, "inputs");
  if (!out->inputs_obj) return Status::InvalidArgument("missing field \"inputs\"");
  return DecodeTensorList(*out->inputs_obj, &out->inputs, /*allow_stored=*/true);
}

std::vector<int32_t> StoredInputs(const std::vector<TensorRef>& inputs) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].stored) out.push_back(static_cast<int32_t>(i));
  return out;
}

void PackSubmitJob(Packer& pk, std::string_view id, std::string_view model,
                   const std::vector<Tensor>& inputs, int64_t priority, int64_t timeout_ms,
                   int64_t result_ttl_s, const std::vector<bool>& stored,
                   const std::vector<bool>& attached) {
  uint32_t n = 3 + (priority != 0) + (timeout_ms != 0) + (result_ttl_s != 0);
  pk.pack_map(n);
  PackString(pk, "id");
  PackString(pk, id);
  PackString(pk, "model");
  PackString(pk, model);
  PackString(pk, "inputs");
  pk.pack_array(static_cast<uint32_t>(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < stored.size() && stored[i])
      PackStoredTensor(pk, inputs[i].dtype, inputs[i].shape);
    else if (i < attached.size() && attached[i])
      PackAttachedTensor(pk, inputs[i].dtype, inputs[i].shape);
    else
      PackTensor(pk, inputs[i]);
  }
  if (priority != 0) {
    PackString(pk, "priority");
    pk.pack_int64(priority);
  }
  if (timeout_ms != 0) {
    PackString(pk, "timeout_ms");
    pk.pack_int64(timeout_ms);
  }
  if (result_ttl_s != 0) {
    PackString(pk, "result_ttl_s");
    pk.pack_int64(result_ttl_s);
  }
}

zmq::message_t EncodeAccepted(const Accepted& a) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(2 + RidEntries(a.rid));
  PackString(pk, "ids");
  pk.pack_array(static_cast<uint32_t>(a.ids.size()));
  for (const auto& id : a.ids) PackString(pk, id);
  PackString(pk, "rejected");
  pk.pack_array(static_cast<uint32_t>(a.rejected.size()));
  for (const auto& r : a.rejected) {
    pk.pack_map(3);
    PackString(pk, "id");
    PackString(pk, r.id);
    PackString(pk, "code");
    PackString(pk, r.code);
    PackString(pk, "message");
    PackString(pk, r.message);
  }
  PackRid(pk, a.rid);
  return ToMessage(std::move(buf));
}

Status DecodeAccepted(const msgpack::object& body, Accepted* out) {
  FERRY_RETURN_IF_ERROR(GetInt(body, "rid", &out->rid, 0));
  FERRY_RETURN_IF_ERROR(GetStringArray(body, "ids", &out->ids));
  out->rejected.clear();
  const msgpack::object* rej = Find(body, "rejected");
  if (!rej) return Status::Ok();
  if (rej->type != msgpack::type::ARRAY) return Status::InvalidArgument("rejected: not an array");
  for (uint32_t i = 0; i < rej->via.array.size; ++i) {
    Rejection r;
    const auto& e = rej->via.array.ptr[i];
    GetString(e, "id", &r.id);  // may be absent when the job had no readable id
    FERRY_RETURN_IF_ERROR(GetString(e, "code", &r.code));
    FERRY_RETURN_IF_ERROR(GetString(e, "message", &r.message));
    out->rejected.push_back(std::move(r));
  }
  return Status::Ok();
}

zmq::message_t EncodeError(int64_t rid, std::string_view code, std::string_view message) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(2 + RidEntries(rid));
  PackString(pk, "code");
  PackString(pk, code);
  PackString(pk, "message");
  PackString(pk, message);
  PackRid(pk, rid);
  return ToMessage(std::move(buf));
}

Status DecodeError(const msgpack::object& body, Status* out) {
  std::string code, message;
  FERRY_RETURN_IF_ERROR(GetString(body, "code", &code));
  FERRY_RETURN_IF_ERROR(GetString(body, "message", &message));
  *out = Status(code, message);
  return Status::Ok();
}

zmq::message_t EncodeLimits(const BrokerLimits& limits, int64_t rid) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(3 + RidEntries(rid));
  PackString(pk, "max_message_bytes");
  pk.pack_int64(limits.max_message_bytes);
  PackString(pk, "max_job_bytes");
  pk.pack_int64(limits.max_job_bytes);
  PackString(pk, "max_jobs_per_message");
  pk.pack_int64(limits.max_jobs_per_message);
  PackRid(pk, rid);
  return ToMessage(std::move(buf));
}

Status DecodeLimits(const msgpack::object& body, BrokerLimits* out) {
  BrokerLimits l;
  FERRY_RETURN_IF_ERROR(GetInt(body, "max_message_bytes", &l.max_message_bytes, 0));
  FERRY_RETURN_IF_ERROR(GetInt(body, "max_job_bytes", &l.max_job_bytes, 0));
  FERRY_RETURN_IF_ERROR(GetInt(body, "max_jobs_per_message", &l.max_jobs_per_message, 0));
  if (l.max_message_bytes < 1024 || l.max_jobs_per_message < 1)
    return Status::InvalidArgument(
        "LIMITS needs \"max_message_bytes\" >= 1024 and \"max_jobs_per_message\" >= 1");
  *out = l;
  return Status::Ok();
}

zmq::message_t EncodeIds(const std::vector<std::string>& ids, int64_t rid) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1 + RidEntries(rid));
  PackString(pk, "ids");
  pk.pack_array(static_cast<uint32_t>(ids.size()));
  for (const auto& id : ids) PackString(pk, id);
  PackRid(pk, rid);
  return ToMessage(std::move(buf));
}

namespace {
void PackInlineResults(Packer& pk, const InlineResults& results) {
  PackString(pk, "results");
  pk.pack_map(static_cast<uint32_t>(results.size()));
  for (const auto& [id, record] : results) {
    PackString(pk, id);
    pk.pack_bin(static_cast<uint32_t>(record.size()));
    pk.pack_bin_body(record.data(), static_cast<uint32_t>(record.size()));
  }
}
}  // namespace

zmq::message_t EncodeDone(const std::vector<std::string>& ids, int64_t duplicates,
                          const DoneStatuses& not_done, const InlineResults& results,
                          const std::vector<std::string>& notified, bool bye) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1 + (duplicates > 0 ? 1 : 0) + (not_done.empty() ? 0 : 1) +
              (results.empty() ? 0 : 1) + (notified.empty() ? 0 : 1) + (bye ? 1 : 0));
  PackString(pk, "ids");
  pk.pack_array(static_cast<uint32_t>(ids.size()));
  for (const auto& id : ids) PackString(pk, id);
  if (duplicates > 0) {
    PackString(pk, "duplicates");
    pk.pack_int64(duplicates);
  }
  if (!not_done.empty()) {
    PackString(pk, "not_done");
    pk.pack_map(static_cast<uint32_t>(not_done.size()));
    for (const auto& [id, status] : not_done) {
      PackString(pk, id);
      PackString(pk, status);
    }
  }
  if (!results.empty()) PackInlineResults(pk, results);
  if (!notified.empty()) {
    PackString(pk, "notified");
    pk.pack_array(static_cast<uint32_t>(notified.size()));
    for (const auto& id : notified) PackString(pk, id);
  }
  if (bye) {
    PackString(pk, "bye");
    pk.pack_true();
  }
  return ToMessage(std::move(buf));
}

Status DecodeDoneNotified(const msgpack::object& body, std::vector<std::string>* out) {
  out->clear();
  if (!Find(body, "notified")) return Status::Ok();
  return GetStringArray(body, "notified", out);
}

zmq::message_t EncodeFinished(const std::vector<std::string>& ids, const InlineResults& results) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(results.empty() ? 1 : 2);
  PackString(pk, "ids");
  pk.pack_array(static_cast<uint32_t>(ids.size()));
  for (const auto& id : ids) PackString(pk, id);
  if (!results.empty()) PackInlineResults(pk, results);
  return ToMessage(std::move(buf));
}

Status DecodeInlineResults(const msgpack::object& body, InlineResults* out) {
  out->clear();
  const msgpack::object* m = Find(body, "results");
  if (m == nullptr || m->type == msgpack::type::NIL) return Status::Ok();
  if (m->type != msgpack::type::MAP) return Status::InvalidArgument("\"results\" must be a map");
  out->reserve(m->via.map.size);
  for (uint32_t i = 0; i < m->via.map.size; ++i) {
    const auto& kv = m->via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::BIN)
      return Status::InvalidArgument("\"results\" must map ids to binary result records");
    out->emplace_back(AsStringView(kv.key), AsStringView(kv.val));
  }
  return Status::Ok();
}

Status DecodeDoneStatuses(const msgpack::object& body, DoneStatuses* out) {
  out->clear();
  const msgpack::object* m = Find(body, "not_done");
  if (m == nullptr || m->type == msgpack::type::NIL) return Status::Ok();
  if (m->type != msgpack::type::MAP) return Status::InvalidArgument("\"not_done\" must be a map");
  out->reserve(m->via.map.size);
  for (uint32_t i = 0; i < m->via.map.size; ++i) {
    const auto& kv = m->via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR)
      return Status::InvalidArgument("\"not_done\" must map ids to status strings");
    out->emplace_back(std::string(kv.key.via.str.ptr, kv.key.via.str.size),
                      std::string(kv.val.via.str.ptr, kv.val.via.str.size));
  }
  return Status::Ok();
}

zmq::message_t EncodeCancelled(const Cancelled& c) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(3 + RidEntries(c.rid));
  for (const auto& [key, list] :
       {std::pair<const char*, const std::vector<std::string>*>{"ids", &c.ids},
        {"running", &c.running},
        {"not_found", &c.not_found}}) {
    PackString(pk, key);
    pk.pack_array(static_cast<uint32_t>(list->size()));
    for (const auto& id : *list) PackString(pk, id);
  }
  PackRid(pk, c.rid);
  return ToMessage(std::move(buf));
}

Status DecodeCancelled(const msgpack::object& body, Cancelled* out) {
  FERRY_RETURN_IF_ERROR(GetInt(body, "rid", &out->rid, 0));
  FERRY_RETURN_IF_ERROR(GetStringArray(body, "ids", &out->ids));
  if (Find(body, "running")) FERRY_RETURN_IF_ERROR(GetStringArray(body, "running", &out->running));
  if (Find(body, "not_found"))
    FERRY_RETURN_IF_ERROR(GetStringArray(body, "not_found", &out->not_found));
  return Status::Ok();
}

zmq::message_t EncodeEmpty(int64_t rid) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(RidEntries(rid));
  PackRid(pk, rid);
  return ToMessage(std::move(buf));
}

void PackInputSpecs(Packer& pk, const std::vector<InputSpec>& specs) {
  pk.pack_array(static_cast<uint32_t>(specs.size()));
  for (const auto& spec : specs) {
    pk.pack_map(spec.name.empty() ? 2 : 3);
    if (!spec.name.empty()) {
      PackString(pk, "name");
      PackString(pk, spec.name);
    }
    PackString(pk, "dtype");
    PackString(pk, DTypeName(spec.dtype));
    PackString(pk, "shape");
    pk.pack_array(static_cast<uint32_t>(spec.shape.size()));
    for (int64_t d : spec.shape) pk.pack_int64(d);
  }
}

Status DecodeInputSpecs(const msgpack::object& o, std::vector<InputSpec>* out) {
  out->clear();
  if (o.type != msgpack::type::ARRAY) return Status::InvalidArgument("must be an array");
  if (o.via.array.size > kMaxInputsPerJob)
    return Status::InvalidArgument("more than " + std::to_string(kMaxInputsPerJob) + " inputs");
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    const msgpack::object& e = o.via.array.ptr[i];
    const std::string at = "input " + std::to_string(i) + ": ";
    if (e.type != msgpack::type::MAP) return Status::InvalidArgument(at + "must be a map");
    InputSpec spec;
    if (Find(e, "name")) FERRY_RETURN_IF_ERROR(GetString(e, "name", &spec.name));
    std::string dtype;
    FERRY_RETURN_IF_ERROR(GetString(e, "dtype", &dtype));
    if (!ParseDType(dtype, &spec.dtype))
      return Status::InvalidArgument(at + "unknown dtype \"" + Printable(dtype, 32) + "\"");
    const msgpack::object* shape = Find(e, "shape");
    if (!shape || shape->type != msgpack::type::ARRAY)
      return Status::InvalidArgument(at + "\"shape\" must be an array");
    if (shape->via.array.size > kMaxTensorDims)
      return Status::InvalidArgument(at + "more than " + std::to_string(kMaxTensorDims) + " dims");
    for (uint32_t d = 0; d < shape->via.array.size; ++d) {
      const msgpack::object& v = shape->via.array.ptr[d];
      int64_t dim = 0;
      if (v.type == msgpack::type::POSITIVE_INTEGER && v.via.u64 <= INT64_MAX)
        dim = static_cast<int64_t>(v.via.u64);
      else if (v.type == msgpack::type::NEGATIVE_INTEGER && v.via.i64 == -1)
        dim = -1;
      else
        return Status::InvalidArgument(at + "\"shape\" must hold integers >= -1");
      spec.shape.push_back(dim);
    }
    out->push_back(std::move(spec));
  }
  return Status::Ok();
}

zmq::message_t EncodeHello(const WorkerHello& h) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(6 + (h.resident ? 1 : 0) + (h.held.empty() ? 0 : 1) + (h.heartbeat_ms > 0 ? 1 : 0) +
              (h.redis_prefix ? 1 : 0));
  PackString(pk, "worker");
  PackString(pk, h.worker);
  PackString(pk, "device");
  PackString(pk, h.device);
  PackString(pk, "host");
  PackString(pk, h.host);
  PackString(pk, "pid");
  pk.pack_int64(h.pid);
  PackString(pk, "capacity");
  pk.pack_int64(h.capacity);
  PackString(pk, "models");
  pk.pack_array(static_cast<uint32_t>(h.models.size()));
  for (const auto& m : h.models) {
    pk.pack_map(m.inputs ? 3 : 2);
    PackString(pk, "name");
    PackString(pk, m.name);
    PackString(pk, "max_batch");
    pk.pack_int64(m.max_batch);
    if (m.inputs) {
      PackString(pk, "inputs");
      PackInputSpecs(pk, *m.inputs);
    }
  }
  if (h.resident) {
    PackString(pk, "resident");
    pk.pack_array(static_cast<uint32_t>(h.resident->size()));
    for (const auto& name : *h.resident) PackString(pk, name);
  }
  if (!h.held.empty()) {
    PackString(pk, "held");
    pk.pack_array(static_cast<uint32_t>(h.held.size()));
    for (const auto& id : h.held) PackString(pk, id);
  }
  if (h.heartbeat_ms > 0) {
    PackString(pk, "heartbeat_ms");
    pk.pack_int64(h.heartbeat_ms);
  }
  if (h.redis_prefix) {
    PackString(pk, "redis_prefix");
    PackString(pk, *h.redis_prefix);
  }
  return ToMessage(std::move(buf));
}

Status DecodeHello(const msgpack::object& body, WorkerHello* out) {
  FERRY_RETURN_IF_ERROR(GetString(body, "worker", &out->worker));
  FERRY_RETURN_IF_ERROR(GetString(body, "device", &out->device));
  if (Find(body, "host")) FERRY_RETURN_IF_ERROR(GetString(body, "host", &out->host));
  FERRY_RETURN_IF_ERROR(GetInt(body, "pid", &out->pid, 0));
  FERRY_RETURN_IF_ERROR(GetInt(body, "capacity", &out->capacity, 0));
  if (out->capacity < 1) return Status::InvalidArgument("\"capacity\" must be >= 1");
  const msgpack::object* models = Find(body, "models");
  if (!models || models->type != msgpack::type::ARRAY)
    return Status::InvalidArgument("\"models\" must be an array");
  out->models.clear();
  for (uint32_t i = 0; i < models->via.array.size; ++i) {
    ModelInfo m;
    FERRY_RETURN_IF_ERROR(GetString(models->via.array.ptr[i], "name", &m.name));
    FERRY_RETURN_IF_ERROR(GetInt(models->via.array.ptr[i], "max_batch", &m.max_batch, 1));
    if (m.max_batch < 1) return Status::InvalidArgument("\"max_batch\" must be >= 1");
    if (const msgpack::object* inputs = Find(models->via.array.ptr[i], "inputs")) {
      m.inputs.emplace();
      Status s = DecodeInputSpecs(*inputs, &*m.inputs);
      if (!s.ok())
        return Status::InvalidArgument("\"inputs\" of model " + std::to_string(i) + ": " +
                                       s.message());
    }
    out->models.push_back(std::move(m));
  }
  out->resident.reset();
  if (Find(body, "resident")) {
    std::vector<std::string> resident;
    FERRY_RETURN_IF_ERROR(GetStringArray(body, "resident", &resident));
    out->resident = std::move(resident);
  }
  out->held.clear();
  if (Find(body, "held")) FERRY_RETURN_IF_ERROR(GetStringArray(body, "held", &out->held));
  out->redis_prefix.reset();
  if (Find(body, "redis_prefix"))
    FERRY_RETURN_IF_ERROR(GetString(body, "redis_prefix", &out->redis_prefix.emplace()));
  return GetInt(body, "heartbeat_ms", &out->heartbeat_ms, 0);
}

zmq::message_t EncodeHeartbeat(int64_t heartbeat_ms) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "heartbeat_ms");
  pk.pack_int64(heartbeat_ms);
  return ToMessage(std::move(buf));
}

int64_t DecodeHeartbeat(const zmq::message_t& body) {
  msgpack::object_handle oh;
  int64_t ms = 0;
  if (!UnpackMap(static_cast<const char*>(body.data()), body.size(), &oh).ok() ||
      !GetInt(oh.get(), "heartbeat_ms", &ms, 0).ok() || ms < kMinHeartbeatMs ||
      ms > kMaxHeartbeatMs)
    return 0;
  return ms;
}

namespace {
struct StringAppender {
  std::string* s;
  void write(const char* p, size_t len) { s->append(p, len); }
};
}  // namespace

void PackObjectInto(const msgpack::object& o, size_t size_hint, std::string* out) {
  out->clear();
  out->reserve(size_hint);
  StringAppender appender{out};
  msgpack::pack(appender, o);
}

void PackChunkEntry(Packer& pk, std::string_view id, std::string_view model,
                    std::string_view inputs_raw, int64_t attempt, int64_t priority,
                    int64_t result_ttl_s, int64_t submitted_us, int64_t dispatched_us,
                    int64_t deadline_us, std::string_view notify) {
  pk.pack_map(notify.empty() ? 9 : 10);
  PackString(pk, "id");
  PackString(pk, id);
  PackString(pk, "model");
  PackString(pk, model);
  PackString(pk, "inputs");
  // Already msgpack: splice the bytes in as they are.
  pk.pack_bin_body(inputs_raw.data(), static_cast<uint32_t>(inputs_raw.size()));
  PackString(pk, "attempt");
  pk.pack_int64(attempt);
  PackString(pk, "priority");
  pk.pack_int64(priority);
  PackString(pk, "result_ttl_s");
  pk.pack_int64(result_ttl_s);
  PackString(pk, "submitted");
  pk.pack_int64(submitted_us);
  PackString(pk, "dispatched");
  pk.pack_int64(dispatched_us);
  PackString(pk, "deadline");
  pk.pack_int64(deadline_us);
  if (!notify.empty()) {
    PackString(pk, "notify");
    PackString(pk, notify);
  }
}

Status DecodeChunkEntry(const msgpack::object& o, ChunkJob* out) {
  FERRY_RETURN_IF_ERROR(GetString(o, "id", &out->id));
  FERRY_RETURN_IF_ERROR(GetString(o, "model", &out->model));
  const msgpack::object* inputs = Find(o, "inputs");
  if (!inputs) return Status::InvalidArgument("missing field \"inputs\"");
  FERRY_RETURN_IF_ERROR(DecodeTensorList(*inputs, &out->inputs, /*allow_stored=*/true));
  out->stored_inputs = StoredInputs(out->inputs);
  FERRY_RETURN_IF_ERROR(GetInt(o, "attempt", &out->attempt, 1));
  FERRY_RETURN_IF_ERROR(GetInt(o, "priority", &out->priority, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "result_ttl_s", &out->result_ttl_s, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "submitted", &out->submitted_us, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "dispatched", &out->dispatched_us, 0));
  FERRY_RETURN_IF_ERROR(GetInt(o, "deadline", &out->deadline_us, 0));
  out->notify.clear();
  if (Find(o, "notify")) FERRY_RETURN_IF_ERROR(GetString(o, "notify", &out->notify));
  return Status::Ok();
}

}  // namespace ferry::protocol
