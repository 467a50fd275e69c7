// SUBMIT bodies along the path a job takes through the broker to a worker, as
// broker/src/frontend.cc (HandleSubmit) and broker.cc (Dispatch) run it, with no sockets:
// {"jobs": [job, ...], "rid"?, "notify"?, "ack"?, "inline_results"?}, each job through
// protocol::DecodeSubmitJob, then admission (broker/src/admission.cc, Admit) against a broker
// whose one worker serves "tiny" and "whisper" with small queue and byte limits, the accepted job
// queued (Scheduler::Add) and journaled (Journal::Encode -> Decode), then dispatched in CHUNKs
// (Scheduler::NextChunk, PackChunkEntry) that are decoded as the worker decodes them
// (protocol::DecodeChunkEntry). Attached inputs get data frames of their size, made here as a
// producer sends them (1 byte where the size is over the admission limit), matched as
// HandleSubmit and the worker match them. Invariants: an accepted job has a valid id and model
// and tensors that point into the body; the frame count is the attached inputs'; re-packed
// inputs decode to the same tensors; PackSubmitJob -> DecodeSubmitJob and the journal give the
// same job (attached inputs journaled with their bytes); every accepted job reaches the worker
// once, with the inputs (and data frames) it was submitted with.
#include <map>
#include <memory>

#include "admission.h"
#include "ferry/broker/broker.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
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
  std::vector<bool> stored, attached;
  for (const auto& t : job.inputs) {
    inputs.push_back(ferry::fuzz::Owned(t));
    stored.push_back(t.stored);
    attached.push_back(t.attached);
  }
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackSubmitJob(pk, job.id, job.model, inputs, job.priority, job.timeout_ms,
                          job.result_ttl_s, stored, attached);
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
                             const ferry::broker::BrokerOptions& options,
                             std::vector<zmq::message_t> frames) {
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
    hint += (t.stored || t.attached ? 0 : t.size) + 64;
    if (t.stored) job->stored_bytes += static_cast<int64_t>(t.size);
    if (t.attached) job->attached_bytes += static_cast<int64_t>(t.size);
  }
  job->frames = std::move(frames);
  job->stored_inputs = protocol::StoredInputs(in.inputs);
  protocol::PackObjectInto(*in.inputs_obj, hint, &job->inputs_raw);
  return job;
}

// The inputs of a queued job with their bytes: attached ones matched to the job's frames.
std::vector<protocol::TensorRef> WithFrames(const Job& job, msgpack::object_handle* oh) {
  std::vector<protocol::TensorRef> tensors = DecodeRaw(job.inputs_raw, oh);
  FUZZ_CHECK_OK(protocol::MatchFrames(&tensors, job.frames.data(), job.frames.size()));
  return tensors;
}

void CheckJournal(const Job& job) {
  Job back;
  FUZZ_CHECK_OK(ferry::broker::Journal::Decode(ferry::broker::Journal::Encode(job), &back));
  FUZZ_CHECK(back.id == job.id && back.model == job.model &&
             back.stored_inputs == job.stored_inputs && back.stored_bytes == job.stored_bytes);
  if (job.frames.empty()) {
    FUZZ_CHECK(back.inputs_raw == job.inputs_raw);
    return;
  }
  // Attached inputs are journaled with their bytes: the same tensors, in the "data" form.
  msgpack::object_handle a, b;
  const std::vector<protocol::TensorRef> want = WithFrames(job, &a);
  const std::vector<protocol::TensorRef> got = DecodeRaw(back.inputs_raw, &b);
  FUZZ_CHECK(back.frames.empty() && got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    protocol::TensorRef w = want[k];
    w.attached = false;
    FUZZ_CHECK(ferry::fuzz::SameTensor(w, got[k]));
  }
}

// Sends every queued job to the worker in CHUNKs and decodes them as the worker does.
// What a producer submitted: its inputs as HandleSubmit left them (attached ones pointing into
// their frames, which the job holds).
struct Submitted {
  std::vector<protocol::TensorRef> inputs;
};

void Dispatch(ferry::broker::Scheduler* scheduler, std::map<std::string, Submitted>* expected) {
  ferry::broker::Chunk chunk;
  while (scheduler->NextChunk(&chunk)) {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(chunk.jobs.size()));
    std::vector<std::string> ids;
    std::vector<zmq::message_t> frames;  // as broker.cc sends them: shared, in job order
    for (Job* j : chunk.jobs) {
      protocol::PackChunkEntry(pk, j->id, j->model, j->inputs_raw, j->attempt, j->priority,
                               j->result_ttl_s, j->submitted_us, j->submitted_us + 1,
                               j->deadline_us, j->notify);
      ids.push_back(j->id);
      for (zmq::message_t& f : j->frames) {
        frames.emplace_back();
        frames.back().copy(f);
      }
    }
    const std::string bytes = ferry::fuzz::Bytes(buf);
    msgpack::object_handle oh = ferry::fuzz::MustUnpack(bytes);
    const msgpack::object* entries = protocol::Find(oh.get(), "jobs");
    FUZZ_CHECK(entries != nullptr && entries->via.array.size == ids.size());
    FUZZ_CHECK(protocol::AttachedCount(*entries) == frames.size());
    size_t next_frame = 0;
    for (uint32_t i = 0; i < entries->via.array.size; ++i) {
      protocol::ChunkJob job;
      FUZZ_CHECK_OK(protocol::DecodeChunkEntry(entries->via.array.ptr[i], &job));
      const size_t n = protocol::AttachedInJob(entries->via.array.ptr[i]);
      FUZZ_CHECK_OK(protocol::MatchFrames(&job.inputs, frames.data() + next_frame, n));
      next_frame += n;
      auto it = expected->find(job.id);
      FUZZ_CHECK(it != expected->end());  // accepted, and not delivered before
      // The worker gets the bytes the producer sent: the body's, or the data frames'.
      const std::vector<protocol::TensorRef> want = it->second.inputs;
      FUZZ_CHECK(want.size() == job.inputs.size());
      for (size_t k = 0; k < want.size(); ++k) {
        FUZZ_CHECK(want[k].dtype == job.inputs[k].dtype && want[k].shape == job.inputs[k].shape &&
                   want[k].stored == job.inputs[k].stored && want[k].size == job.inputs[k].size);
        if (!want[k].stored && want[k].size > 0)
          FUZZ_CHECK(std::string(want[k].data, want[k].size) ==
                     std::string(job.inputs[k].data, job.inputs[k].size));
      }
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

  std::map<std::string, Submitted> accepted;
  protocol::SubmitJob in;
  for (uint32_t i = 0; i < jobs->via.array.size; ++i) {
    // The job's data frames, as a producer sends them: one per attached input, of its size
    // (up to the admission limit: a bigger one gets a frame of 1 byte, which MatchFrames
    // refuses, as the broker refuses a frame of the wrong size).
    const size_t n = protocol::AttachedInJob(jobs->via.array.ptr[i]);
    if (!protocol::DecodeSubmitJob(jobs->via.array.ptr[i], &in).ok()) continue;
    FUZZ_CHECK(protocol::IsValidJobId(in.id));
    FUZZ_CHECK(!in.model.empty() && in.model.size() <= protocol::kMaxModelName);
    FUZZ_CHECK(in.timeout_ms >= 0 && in.result_ttl_s >= 0);
    FUZZ_CHECK(in.inputs_obj != nullptr);
    for (const auto& t : in.inputs) ferry::fuzz::CheckTensor(t, begin, size);
    RoundTrip(in);
    std::vector<zmq::message_t> frames;
    for (const auto& t : in.inputs) {
      if (!t.attached) continue;
      const size_t bytes = t.size <= 8192 ? t.size : 1;
      std::string fill(bytes, '\0');
      for (size_t k = 0; k < bytes; ++k) fill[k] = static_cast<char>(k * 31 + frames.size());
      frames.emplace_back(fill.data(), fill.size());
    }
    FUZZ_CHECK(frames.size() == n);  // the frame count before decoding is the decoder's
    if (!protocol::MatchFrames(&in.inputs, frames.data(), frames.size()).ok()) continue;
    if (!ferry::broker::Admit(in, scheduler, options).ok()) continue;
    Submitted submitted{in.inputs};  // points into the body and the frames (moved, not copied)
    std::unique_ptr<Job> job = MakeJob(in, notify, options, std::move(frames));
    msgpack::object_handle raw_oh;
    FUZZ_CHECK(ferry::fuzz::SameTensors(in.inputs, WithFrames(*job, &raw_oh)));
    CheckJournal(*job);
    accepted[in.id] = std::move(submitted);
    FUZZ_CHECK_OK(scheduler.Add(std::move(job)));
  }
  FUZZ_CHECK(scheduler.pending_bytes() <= options.max_pending_bytes);
  Dispatch(&scheduler, &accepted);
  FUZZ_CHECK(accepted.empty() && scheduler.pending() == 0);
  return 0;
}
