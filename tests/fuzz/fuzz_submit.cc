// SUBMIT bodies along the path a job takes through the broker to a worker, as
// broker/src/frontend.cc (HandleSubmit) and broker.cc (Dispatch) run it, with no sockets:
// {"jobs": [job, ...], "rid"?, "notify"?, "ack"?, "inline_results"?}, each job through
// protocol::DecodeSubmitJob, then admission (broker/src/admission.cc, Admit) against a broker
// whose one worker serves "tiny" and "whisper" with small queue and byte limits, the accepted job
// queued (Scheduler::Add) and journaled (Journal::Encode -> Decode), then dispatched in CHUNKs
// (Scheduler::NextChunk, PackChunkEntry) that are decoded as the worker decodes them
// (protocol::DecodeChunkEntry). Invariants: an accepted job has a valid id and model and tensors
// that point into the body; re-packed inputs decode to the same tensors; PackSubmitJob ->
// DecodeSubmitJob and the journal give the same job; every accepted job reaches the worker once,
// with the inputs it was submitted with.
#include <map>
#include <memory>

#include "admission.h"
#include "ferry/broker/broker.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"
#include "journal.h"
#include "scheduler.h"

namespace {

namespace protocol = ferry::protocol;
using ferry::broker::Job;

// The tensors of a re-packed "inputs" array (what the broker queues, journals and sends in
// CHUNK).
std::vector<protocol::TensorRef> DecodeRaw(const std::string& raw, msgpack::object_handle* oh) {
  size_t offset = 0;
  msgpack::unpack(*oh, raw.data(), raw.size(), offset);
  FUZZ_CHECK(offset == raw.size());
  std::vector<protocol::TensorRef> tensors;
  FUZZ_CHECK_OK(protocol::DecodeTensorList(oh->get(), &tensors, /*allow_stored=*/true));
  return tensors;
}

void RoundTrip(const protocol::SubmitJob& job) {
  std::vector<ferry::Tensor> inputs;
  std::vector<bool> stored;
  for (const auto& t : job.inputs) {
    inputs.push_back(ferry::fuzz::Owned(t));
    stored.push_back(t.stored);
  }
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackSubmitJob(pk, job.id, job.model, inputs, job.priority, job.timeout_ms,
                          job.result_ttl_s, stored);
  const std::string bytes = ferry::fuzz::Bytes(buf);
  msgpack::object_handle oh = ferry::fuzz::MustUnpack(bytes);
  protocol::SubmitJob back;
  FUZZ_CHECK_OK(
      protocol::DecodeSubmitJob(protocol::Find(oh.get(), "jobs")->via.array.ptr[0], &back));
  FUZZ_CHECK(back.id == job.id && back.model == job.model);
  FUZZ_CHECK(back.priority == job.priority && back.timeout_ms == job.timeout_ms &&
             back.result_ttl_s == job.result_ttl_s);
  FUZZ_CHECK(ferry::fuzz::SameTensors(job.inputs, back.inputs));
}

// The queued job, built as HandleSubmit builds it.
std::unique_ptr<Job> MakeJob(const protocol::SubmitJob& in, const std::string& notify,
                             const ferry::broker::BrokerOptions& options) {
  auto job = std::make_unique<Job>();
  job->id = in.id;
  job->model = in.model;
  job->priority = in.priority;
  job->timeout_ms = in.timeout_ms;
  job->result_ttl_s = in.result_ttl_s > 0 ? in.result_ttl_s : options.default_result_ttl_s;
  job->submitted_us = 1'700'000'000'000'000;
  job->deadline_us = 0;  // TakeExpired is not fuzzed: no deadline passes here
  job->notify = notify;
  size_t hint = 16;
  for (const auto& t : in.inputs) {
    hint += (t.stored ? 0 : t.size) + 64;
    if (t.stored) job->stored_bytes += static_cast<int64_t>(t.size);
  }
  job->stored_inputs = protocol::StoredInputs(in.inputs);
  protocol::PackObjectInto(*in.inputs_obj, hint, &job->inputs_raw);
  return job;
}

void CheckJournal(const Job& job) {
  Job back;
  FUZZ_CHECK_OK(ferry::broker::Journal::Decode(ferry::broker::Journal::Encode(job), &back));
  FUZZ_CHECK(back.id == job.id && back.model == job.model && back.inputs_raw == job.inputs_raw &&
             back.stored_inputs == job.stored_inputs && back.stored_bytes == job.stored_bytes);
}

// Sends every queued job to the worker in CHUNKs and decodes them as the worker does.
void Dispatch(ferry::broker::Scheduler* scheduler, std::map<std::string, std::string>* expected) {
  ferry::broker::Chunk chunk;
  while (scheduler->NextChunk(&chunk)) {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(chunk.jobs.size()));
    std::vector<std::string> ids;
    for (const Job* j : chunk.jobs) {
      protocol::PackChunkEntry(pk, j->id, j->model, j->inputs_raw, j->attempt, j->priority,
                               j->result_ttl_s, j->submitted_us, j->submitted_us + 1,
                               j->deadline_us, j->notify);
      ids.push_back(j->id);
    }
    const std::string bytes = ferry::fuzz::Bytes(buf);
    msgpack::object_handle oh = ferry::fuzz::MustUnpack(bytes);
    const msgpack::object* entries = protocol::Find(oh.get(), "jobs");
    FUZZ_CHECK(entries != nullptr && entries->via.array.size == ids.size());
    for (uint32_t i = 0; i < entries->via.array.size; ++i) {
      protocol::ChunkJob job;
      FUZZ_CHECK_OK(protocol::DecodeChunkEntry(entries->via.array.ptr[i], &job));
      auto it = expected->find(job.id);
      FUZZ_CHECK(it != expected->end());  // accepted, and not delivered before
      msgpack::object_handle raw_oh;
      FUZZ_CHECK(ferry::fuzz::SameTensors(job.inputs, DecodeRaw(it->second, &raw_oh)));
      for (int32_t k : job.stored_inputs) FUZZ_CHECK(job.inputs.at(static_cast<size_t>(k)).stored);
      expected->erase(it);
    }
    std::vector<std::string> not_held;
    FUZZ_CHECK(scheduler->Complete(chunk.worker, ids, &not_held).size() == ids.size());
    FUZZ_CHECK(not_held.empty());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  const msgpack::object& body = oh.get();
  int64_t rid = 0;
  (void)protocol::GetInt(body, "rid", &rid, 0);
  std::string notify;
  if (const msgpack::object* n = protocol::Find(body, "notify")) {
    notify = std::string(protocol::AsStringView(*n));
    if (n->type != msgpack::type::STR || !protocol::Keys().IsNotifyChannel(notify)) notify.clear();
  }
  const msgpack::object* jobs = protocol::Find(body, "jobs");
  if (jobs == nullptr || jobs->type != msgpack::type::ARRAY) return 0;

  ferry::broker::BrokerOptions options;
  options.max_queue = 8;
  options.max_job_bytes = 4096;
  options.max_pending_bytes = 16384;
  ferry::broker::Scheduler scheduler;
  protocol::WorkerHello hello;
  hello.worker = "host:1:cpu";
  hello.device = "cpu";
  hello.host = "host";
  hello.pid = 1;
  hello.capacity = 4;
  hello.models = {{"tiny", 2}, {"whisper", 4}};
  scheduler.AddWorker("worker-1", hello, /*now_us=*/1);

  std::map<std::string, std::string> accepted;  // id -> inputs_raw
  protocol::SubmitJob in;
  for (uint32_t i = 0; i < jobs->via.array.size; ++i) {
    if (!protocol::DecodeSubmitJob(jobs->via.array.ptr[i], &in).ok()) continue;
    FUZZ_CHECK(protocol::IsValidJobId(in.id));
    FUZZ_CHECK(!in.model.empty() && in.model.size() <= protocol::kMaxModelName);
    FUZZ_CHECK(in.timeout_ms >= 0 && in.result_ttl_s >= 0);
    FUZZ_CHECK(in.inputs_obj != nullptr);
    for (const auto& t : in.inputs) ferry::fuzz::CheckTensor(t, begin, size);
    RoundTrip(in);
    if (!ferry::broker::Admit(in, scheduler, options).ok()) continue;
    std::unique_ptr<Job> job = MakeJob(in, notify, options);
    msgpack::object_handle raw_oh;
    FUZZ_CHECK(ferry::fuzz::SameTensors(in.inputs, DecodeRaw(job->inputs_raw, &raw_oh)));
    CheckJournal(*job);
    accepted[in.id] = job->inputs_raw;
    FUZZ_CHECK_OK(scheduler.Add(std::move(job)));
  }
  FUZZ_CHECK(scheduler.pending_bytes() <= options.max_pending_bytes);
  Dispatch(&scheduler, &accepted);
  FUZZ_CHECK(accepted.empty() && scheduler.pending() == 0);
  return 0;
}
