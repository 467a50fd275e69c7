// CHUNK bodies as the worker's broker link reads them (gpu-worker/src/broker_link.cc,
// HandleChunk): {"jobs": [entry, ...]}, each entry through protocol::DecodeChunkEntry
// (protocol/src/messages.cc). Invariants: tensors point into the body, the stored-input indexes
// name stored inputs, an entry's count of data frames (AttachedInJob) is its attached inputs,
// and PackChunkEntry -> DecodeChunkEntry gives the same entry.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace {

namespace protocol = ferry::protocol;

void RoundTrip(const msgpack::object& entry, const protocol::ChunkJob& job) {
  std::string inputs_raw;  // as the broker keeps a job's inputs: their msgpack bytes
  protocol::PackObjectInto(*protocol::Find(entry, "inputs"), 64, &inputs_raw);
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackChunkEntry(pk, job.id, job.model, inputs_raw, job.attempt, job.priority,
                           job.result_ttl_s, job.submitted_us, job.dispatched_us, job.deadline_us,
                           job.notify);
  const std::string bytes = ferry::fuzz::Bytes(buf);
  msgpack::object_handle oh = ferry::fuzz::MustUnpack(bytes);
  protocol::ChunkJob back;
  FUZZ_CHECK_OK(
      protocol::DecodeChunkEntry(protocol::Find(oh.get(), "jobs")->via.array.ptr[0], &back));
  FUZZ_CHECK(back.id == job.id && back.model == job.model && back.notify == job.notify);
  FUZZ_CHECK(back.attempt == job.attempt && back.priority == job.priority &&
             back.result_ttl_s == job.result_ttl_s && back.submitted_us == job.submitted_us &&
             back.dispatched_us == job.dispatched_us && back.deadline_us == job.deadline_us);
  FUZZ_CHECK(ferry::fuzz::SameTensors(job.inputs, back.inputs));
  FUZZ_CHECK(back.stored_inputs == job.stored_inputs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  const msgpack::object* entries = protocol::Find(oh.get(), "jobs");
  if (entries == nullptr || entries->type != msgpack::type::ARRAY) return 0;
  for (uint32_t i = 0; i < entries->via.array.size; ++i) {
    protocol::ChunkJob job;
    if (!protocol::DecodeChunkEntry(entries->via.array.ptr[i], &job).ok()) continue;
    for (const auto& t : job.inputs) ferry::fuzz::CheckTensor(t, begin, size);
    for (int32_t k : job.stored_inputs) FUZZ_CHECK(job.inputs.at(static_cast<size_t>(k)).stored);
    // The entry's share of the CHUNK's data frames is exactly its attached inputs.
    size_t attached = 0;
    for (const auto& t : job.inputs) attached += t.attached;
    FUZZ_CHECK(protocol::AttachedInJob(entries->via.array.ptr[i]) == attached);
    RoundTrip(entries->via.array.ptr[i], job);
  }
  return 0;
}
