#include "journal.h"

#include <algorithm>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {
namespace {
constexpr int64_t kModelsTtlS = 7 * 24 * 3600;
constexpr size_t kScanBatch = 1000;
// Restaged records written per commit: at most this many, and no more once this many bytes.
constexpr size_t kMaxUpdatesPerCommit = 1024;
constexpr size_t kMaxUpdateBytesPerCommit = size_t{16} << 20;

// Packs `job`'s inputs array with each attached input's frame as its "data".
void PackInputsWithData(protocol::Packer& pk, const Job& job) {
  // By reference: the inline bins are packed from job.inputs_raw, not from copies.
  msgpack::object_handle oh =
      msgpack::unpack(job.inputs_raw.data(), job.inputs_raw.size(),
                      [](msgpack::type::object_type, std::size_t, void*) { return true; });
  const msgpack::object& inputs = oh.get();
  pk.pack_array(inputs.via.array.size);
  size_t frame = 0;
  for (uint32_t i = 0; i < inputs.via.array.size; ++i) {
    const msgpack::object& t = inputs.via.array.ptr[i];
    if (!protocol::IsAttached(t) || frame >= job.frames.size()) {
      pk.pack(t);
      continue;
    }
    const zmq::message_t& f = job.frames[frame++];  // every attached map took a frame
    protocol::TensorRef ref;
    if (protocol::DecodeTensor(t, &ref, /*allow_stored=*/true).ok())
      protocol::PackTensor(pk, ref.dtype, ref.shape, f.data(), f.size());
    else
      pk.pack(t);  // not reached: admission decoded it; Decode refuses the record
  }
}
}  // namespace

std::string Journal::Encode(const Job& job) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(job.owner.empty() ? 10 : 11);
  if (!job.owner.empty()) {  // with CURVE: the submitter's key, who may cancel the job
    protocol::PackString(pk, "owner");
    protocol::PackString(pk, job.owner);
  }
  protocol::PackString(pk, "id");
  protocol::PackString(pk, job.id);
  protocol::PackString(pk, "model");
  protocol::PackString(pk, job.model);
  protocol::PackString(pk, "priority");
  pk.pack_int64(job.priority);
  protocol::PackString(pk, "timeout_ms");
  pk.pack_int64(job.timeout_ms);
  protocol::PackString(pk, "result_ttl_s");
  pk.pack_int64(job.result_ttl_s);
  protocol::PackString(pk, "submitted");
  pk.pack_int64(job.submitted_us);
  protocol::PackString(pk, "deadline");
  pk.pack_int64(job.deadline_us);
  protocol::PackString(pk, "seq");
  pk.pack_int64(job.seq);
  protocol::PackString(pk, "attempt");
  pk.pack_int64(job.attempt);
  protocol::PackString(pk, "inputs");
  if (!job.frames.empty()) {
    // Attached inputs are journaled with their bytes ("data"), so that a record stands alone.
    PackInputsWithData(pk, job);
    return std::string(buf.data(), buf.size());
  }
  // The inputs are msgpack already: one copy of their bytes, after the small head.
  std::string record;
  record.reserve(buf.size() + job.inputs_raw.size());
  record.append(buf.data(), buf.size());
  record.append(job.inputs_raw);
  return record;
}

Status Journal::Decode(const std::string& bytes, Job* out) {
  msgpack::object_handle oh;
  FERRY_RETURN_IF_ERROR(protocol::UnpackMap(bytes.data(), bytes.size(), &oh));
  const msgpack::object& o = oh.get();
  FERRY_RETURN_IF_ERROR(protocol::GetString(o, "id", &out->id));
  FERRY_RETURN_IF_ERROR(protocol::GetString(o, "model", &out->model));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "priority", &out->priority, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "timeout_ms", &out->timeout_ms, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "result_ttl_s", &out->result_ttl_s, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "submitted", &out->submitted_us, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "deadline", &out->deadline_us, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "seq", &out->seq, 0));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(o, "attempt", &out->attempt, 1));
  if (protocol::Find(o, "owner") != nullptr)
    FERRY_RETURN_IF_ERROR(protocol::GetString(o, "owner", &out->owner));
  const msgpack::object* inputs = protocol::Find(o, "inputs");
  if (!inputs) return Status::InvalidArgument("journal record without inputs");
  std::vector<protocol::TensorRef> tensors;  // which are stored in Redis, and their bytes
  FERRY_RETURN_IF_ERROR(protocol::DecodeTensorList(*inputs, &tensors, /*allow_stored=*/true));
  for (const auto& t : tensors) {  // journaled with their bytes: a record never holds frames
    if (t.attached) return Status::InvalidArgument("journal record with an attached input");
  }
  out->stored_inputs = protocol::StoredInputs(tensors);
  out->stored_bytes = 0;
  for (const auto& t : tensors)
    if (t.stored) out->stored_bytes += static_cast<int64_t>(t.size);
  msgpack::sbuffer raw;
  msgpack::pack(raw, *inputs);
  out->inputs_raw.assign(raw.data(), raw.size());
  return Status::Ok();
}

void Journal::Stage(const Job& job) {
  if (forgotten_.erase(job.id) > 0) unforgotten_.push_back(job.id);
  updates_.erase(job.id);  // an earlier job's of the same id
  staged_.emplace_back(job.id, Encode(job));
}
void Journal::Restage(const std::string& id) { updates_.insert(id); }
void Journal::Forget(const std::string& id, int64_t now_mono_us) {
  if (forgotten_.empty()) oldest_forget_us_ = now_mono_us;
  forgotten_.insert(id);
}
void Journal::NoteModel(const std::string& model) { models_.insert(model); }

Status Journal::Commit(const FindJob& find) {
  if (idle()) return Status::Ok();
  if (Status s = redis_->EnsureConnected(); !s.ok()) {
    // Nothing can have been sent: the staged records cannot land later, so no removal is queued
    // for them (while Redis is down, one per id rejected would pile up, and all go in one HDEL)
    // -- except those Stage took back: an earlier write of the id may land yet.
    for (auto& id : unforgotten_) {
      if (forgotten_.empty()) oldest_forget_us_ = protocol::MonotonicMicros();
      forgotten_.insert(std::move(id));
    }
    unforgotten_.clear();
    staged_.clear();
    return s;
  }
  unforgotten_.clear();  // from here a failure queues every staged id's removal
  const std::string journal = keys_.Journal();
  // Records written again, a bounded part of them per commit: after a Redis restart every
  // pending job's (up to --max-pending-bytes of inputs) waits here, and one write of them all
  // would hold the loop, and this turn's new jobs, for as long as it takes.
  std::vector<std::pair<std::string_view, std::string>> updated;  // id, record
  std::vector<std::string_view> handled;  // the updates this commit writes (or finds done)
  size_t update_bytes = 0;
  for (const auto& id : updates_) {
    if (handled.size() == kMaxUpdatesPerCommit || update_bytes >= kMaxUpdateBytesPerCommit) break;
    handled.push_back(id);
    if (const Job* job = find(id)) {
      updated.emplace_back(id, Encode(*job));
      update_bytes += updated.back().second.size();
    }
  }
  if (!staged_.empty() || !updated.empty()) {
    std::vector<std::string_view> argv = {"HSET", journal};
    for (const auto& [id, record] : staged_) {
      argv.push_back(id);
      argv.push_back(record);
    }
    for (const auto& [id, record] : updated) {
      argv.push_back(id);
      argv.push_back(record);
    }
    redis_->Append(argv);
  }
  if (!forgotten_.empty()) {
    std::vector<std::string_view> argv = {"HDEL", journal};
    for (const auto& id : forgotten_) argv.push_back(id);
    redis_->Append(argv);
  }
  if (!models_.empty()) {
    const std::string key = keys_.Models(), ttl = std::to_string(kModelsTtlS);
    std::vector<std::string_view> argv = {"SADD", key};
    for (const auto& m : models_) argv.push_back(m);
    redis_->Append(argv);
    redis_->Append({"EXPIRE", key, ttl});
  }
  Status s = redis_->Flush(nullptr);
  if (s.ok()) {
    forgotten_.clear();
    oldest_forget_us_ = 0;
    for (const auto id : handled) updates_.erase(std::string(id));
    models_.clear();
  } else if (!staged_.empty()) {
    // Rejected: a write that timed out may land later all the same. Remove them then.
    if (forgotten_.empty()) oldest_forget_us_ = protocol::MonotonicMicros();
    for (const auto& [id, record] : staged_) forgotten_.insert(id);
  }
  staged_.clear();
  return s;
}

Status Journal::Load(std::vector<std::unique_ptr<Job>>* jobs, std::vector<std::string>* models,
                     std::vector<std::pair<std::string, std::string>>* unreadable) {
  jobs->clear();
  models->clear();
  unreadable->clear();
  protocol::RedisReply reply;
  FERRY_RETURN_IF_ERROR(redis_->Command({"SMEMBERS", keys_.Models()}, &reply));
  for (const auto& e : reply.elements) models->push_back(e.str);
  const std::string journal = keys_.Journal(), count = std::to_string(kScanBatch);
  std::string cursor = "0";
  do {
    FERRY_RETURN_IF_ERROR(redis_->Command({"HSCAN", journal, cursor, "COUNT", count}, &reply));
    if (reply.elements.size() != 2) return Status::Internal("unexpected HSCAN reply");
    cursor = reply.elements[0].str;
    const auto& kv = reply.elements[1].elements;
    std::vector<std::unique_ptr<Job>> batch;
    for (size_t i = 0; i + 1 < kv.size(); i += 2) {
      auto job = std::make_unique<Job>();
      Status s = Decode(kv[i + 1].str, job.get());
      if (!s.ok()) {
        if (protocol::IsValidJobId(kv[i].str))  // an accepted job: it gets a failed result
          unreadable->emplace_back(kv[i].str, s.message());
        else
          redis_->Append({"HDEL", journal, kv[i].str});  // not a job's: nothing to tell
        continue;
      }
      batch.push_back(std::move(job));
    }
    // Jobs whose result already exists finished before the crash: drop them.
    for (const auto& job : batch) redis_->Append({"EXISTS", keys_.Result(job->id)});
    std::vector<protocol::RedisReply> exists;
    FERRY_RETURN_IF_ERROR(redis_->Flush(&exists));
    size_t offset = exists.size() - batch.size();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (exists[offset + i].integer > 0)
        redis_->Append({"HDEL", journal, batch[i]->id});
      else
        jobs->push_back(std::move(batch[i]));
    }
    FERRY_RETURN_IF_ERROR(redis_->Flush(nullptr));
  } while (cursor != "0");
  std::sort(jobs->begin(), jobs->end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  return Status::Ok();
}

}  // namespace ferry::broker
