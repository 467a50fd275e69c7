// The result record in Redis (docs/protocol.md, "Results in Redis"): what a worker writes with
// PackResult and a producer reads with DecodeResult.
#include "ferry/protocol/messages.h"

#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

// Outputs at least this big take over the record's buffer when DecodeResult owns it.
constexpr size_t kAdoptOutputBytes = 64 * 1024;

}  // namespace

void PackResult(Packer& pk, const ResultRecord& r) {
  bool done = r.status == "done";
  pk.pack_map(8);
  PackString(pk, "id");
  PackString(pk, r.id);
  PackString(pk, "status");
  PackString(pk, r.status);
  if (done) {
    PackString(pk, "outputs");
    pk.pack_array(static_cast<uint32_t>(r.outputs.size()));
    for (const auto& t : r.outputs) PackTensor(pk, t);
  } else {
    PackString(pk, "error");
    pk.pack_map(2);
    PackString(pk, "code");
    PackString(pk, r.error_code);
    PackString(pk, "message");
    PackString(pk, r.error_message);
  }
  PackString(pk, "model");
  PackString(pk, r.model);
  PackString(pk, "worker");
  PackString(pk, r.worker);
  PackString(pk, "batch_size");
  pk.pack_int64(r.batch_size);
  PackString(pk, "attempt");
  pk.pack_int64(r.attempt);
  PackString(pk, "timing");
  PackIntMap(pk, r.timing_us);
}

namespace {
// DecodeResult; with `adopt` (the string that holds data[0, size)), its largest big output takes
// over adopt's buffer.
Status DecodeResultAdopting(const void* data, size_t size, Result* out, std::string* adopt) {
  msgpack::object_handle oh;
  FERRY_RETURN_IF_ERROR(UnpackMap(data, size, &oh));
  const msgpack::object& body = oh.get();
  FERRY_RETURN_IF_ERROR(GetString(body, "id", &out->id));
  std::string status;
  FERRY_RETURN_IF_ERROR(GetString(body, "status", &status));
  if (status == "done")
    out->state = JobState::kDone;
  else if (status == "failed")
    out->state = JobState::kFailed;
  else if (status == "cancelled")
    out->state = JobState::kCancelled;
  else if (status == "expired")
    out->state = JobState::kExpired;
  else
    return Status::InvalidArgument("unknown result status \"" + status + "\"");
  out->outputs.clear();
  out->error = Status::Ok();
  int adopted = -1;  // the output that takes over *adopt's buffer
  size_t adopted_offset = 0, adopted_size = 0;
  if (out->state == JobState::kDone) {
    const msgpack::object* outputs = Find(body, "outputs");
    if (!outputs) return Status::InvalidArgument("done result without \"outputs\"");
    std::vector<TensorRef> refs;
    FERRY_RETURN_IF_ERROR(DecodeTensorList(*outputs, &refs));
    // The largest big output takes over the record's buffer (below), instead of a copy.
    if (adopt != nullptr) {
      for (size_t k = 0; k < refs.size(); ++k) {
        if (refs[k].size >= kAdoptOutputBytes && (adopted < 0 || refs[k].size > refs[adopted].size))
          adopted = static_cast<int>(k);
      }
    }
    for (size_t k = 0; k < refs.size(); ++k) {
      if (static_cast<int>(k) != adopted) {
        out->outputs.push_back(ToTensor(refs[k]));
        continue;
      }
      Tensor t;
      t.dtype = refs[k].dtype;
      t.shape = refs[k].shape;
      out->outputs.push_back(std::move(t));
      adopted_offset = static_cast<size_t>(refs[k].data - static_cast<const char*>(data));
      adopted_size = refs[k].size;
    }
  } else {
    const msgpack::object* err = Find(body, "error");
    std::string code = codes::kInternal, message;
    if (err) {
      GetString(*err, "code", &code);
      GetString(*err, "message", &message);
    }
    out->error = Status(code, message);
  }
  if (Find(body, "model")) GetString(body, "model", &out->model);
  if (Find(body, "worker")) GetString(body, "worker", &out->worker);
  FERRY_RETURN_IF_ERROR(GetInt(body, "batch_size", &out->batch_size, 0));
  FERRY_RETURN_IF_ERROR(GetInt(body, "attempt", &out->attempt, 0));
  out->timing_us.clear();
  if (const msgpack::object* t = Find(body, "timing"); t && t->type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < t->via.map.size; ++i) {
      const auto& kv = t->via.map.ptr[i];
      int64_t v = 0;
      if (kv.val.type == msgpack::type::POSITIVE_INTEGER)
        v = static_cast<int64_t>(kv.val.via.u64);
      else if (kv.val.type == msgpack::type::NEGATIVE_INTEGER)
        v = kv.val.via.i64;
      out->timing_us[std::string(AsStringView(kv.key))] = v;
    }
  }
  if (adopted >= 0) {  // last: the views into the record are not needed any more
    std::string& bytes = out->outputs[static_cast<size_t>(adopted)].data;
    bytes = std::move(*adopt);
    bytes.erase(0, adopted_offset);  // one move within pages already faulted in
    bytes.resize(adopted_size);
  }
  return Status::Ok();
}
}  // namespace

Status DecodeResult(const void* data, size_t size, Result* out) {
  return DecodeResultAdopting(data, size, out, nullptr);
}

Status DecodeResult(std::string&& record, Result* out) {
  std::string owned = std::move(record);
  return DecodeResultAdopting(owned.data(), owned.size(), out, &owned);
}

}  // namespace ferry::protocol
