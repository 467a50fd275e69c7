// ferry-pack-bench: the CPU cost of the byte-copying steps of a job's path through the producer
// SDK and the broker, in isolation (no sockets, no other processes): a deterministic A/B for
// docs/performance.md, where the fleet's per-process CPU is too noisy on a shared machine.
//
//   ferry-pack-bench [BYTES_PER_JOB=602112] [JOBS_PER_MESSAGE=8] [ROUNDS=200]
//
// Per step it prints microseconds per job and ns per input byte for a msgpack::sbuffer grown by
// doubling ("grow") and a buffer reserved up front ("sized"). The broker's SUBMIT -> inputs_raw
// step and the broker's CHUNK ship "sized" (protocol::PackObjectInto; the CHUNK buffer is
// reserved up front); the SDK's SUBMIT ships "grow": "sized" was faster here but slower in the
// fleet (docs/performance.md, "One copy of the inputs in the servers").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/protocol/messages.h"

namespace {

using Clock = std::chrono::steady_clock;
using ferry::Tensor;
namespace protocol = ferry::protocol;

template <typename F>
double MicrosPerJob(int rounds, int jobs, F&& f) {
  f();  // warm the allocator
  auto t0 = Clock::now();
  for (int r = 0; r < rounds; ++r) f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds / jobs;
}

// The SDK's SUBMIT body for `jobs` jobs; `sized` reserves the buffer up front.
msgpack::sbuffer PackSubmit(const std::vector<Tensor>& inputs, int jobs, bool sized) {
  size_t bytes = 64;
  for (int i = 0; i < jobs; ++i) bytes += 200 + inputs[0].data.size() + 64;
  msgpack::sbuffer buf(sized ? bytes : MSGPACK_SBUFFER_INIT_SIZE);
  protocol::Packer pk(buf);
  pk.pack_map(2);
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(jobs));
  for (int i = 0; i < jobs; ++i)
    protocol::PackSubmitJob(pk, "job-" + std::to_string(i), "m", inputs, 0, 0, 0);
  protocol::PackString(pk, "rid");
  pk.pack_int64(1);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t job_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 602112;
  const int jobs = argc > 2 ? std::atoi(argv[2]) : 8;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 200;
  std::vector<Tensor> inputs(1);
  inputs[0].dtype = ferry::DType::kUInt8;
  inputs[0].shape = {static_cast<int64_t>(job_bytes)};
  inputs[0].data.assign(job_bytes, '\x5a');

  // 1. SDK: pack the SUBMIT body.
  double sdk_grow = MicrosPerJob(rounds, jobs, [&] { PackSubmit(inputs, jobs, false); });
  double sdk_sized = MicrosPerJob(rounds, jobs, [&] { PackSubmit(inputs, jobs, true); });

  // 2. Broker: each job's inputs out of the received SUBMIT into Job::inputs_raw.
  msgpack::sbuffer submit = PackSubmit(inputs, jobs, true);
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(submit.data(), submit.size(), &oh).ok()) return 1;
  const msgpack::object* list = protocol::Find(oh.get(), "jobs");
  std::vector<protocol::SubmitJob> in(static_cast<size_t>(jobs));
  for (int i = 0; i < jobs; ++i)
    if (!protocol::DecodeSubmitJob(list->via.array.ptr[i], &in[i]).ok()) return 1;
  std::vector<std::string> raw(static_cast<size_t>(jobs));
  double admit_grow = MicrosPerJob(rounds, jobs, [&] {
    for (int i = 0; i < jobs; ++i) {
      msgpack::sbuffer b;
      msgpack::pack(b, *in[i].inputs_obj);
      raw[i].assign(b.data(), b.size());
    }
  });
  double admit_sized = MicrosPerJob(rounds, jobs, [&] {
    for (int i = 0; i < jobs; ++i) {
      size_t hint = 16;
      for (const auto& t : in[i].inputs) hint += t.size + 64;
      protocol::PackObjectInto(*in[i].inputs_obj, hint, &raw[i]);
    }
  });

  // 3. Broker: the CHUNK to a worker.
  auto chunk = [&](bool sized) {
    size_t bytes = 32;
    for (const auto& r : raw) bytes += r.size() + 16 + 160;  // id, model, 9 keys, 6 ints
    msgpack::sbuffer buf(sized ? bytes : MSGPACK_SBUFFER_INIT_SIZE);
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(raw.size()));
    for (size_t i = 0; i < raw.size(); ++i)
      protocol::PackChunkEntry(pk, "job-" + std::to_string(i), "m", raw[i], 1, 0, 3600, 1, 2, 0);
  };
  double chunk_grow = MicrosPerJob(rounds, jobs, [&] { chunk(false); });
  double chunk_sized = MicrosPerJob(rounds, jobs, [&] { chunk(true); });

  auto row = [&](const char* step, double grow, double sized) {
    std::printf("%-34s grow %9.1f us/job %6.3f ns/B   sized %9.1f us/job %6.3f ns/B   %5.2fx\n",
                step, grow, grow * 1e3 / job_bytes, sized, sized * 1e3 / job_bytes, grow / sized);
  };
  std::printf("ferry-pack-bench: %zu bytes/job, %d jobs/message, %d rounds\n", job_bytes, jobs,
              rounds);
  row("SDK: pack SUBMIT", sdk_grow, sdk_sized);
  row("broker: SUBMIT -> Job::inputs_raw", admit_grow, admit_sized);
  row("broker: pack CHUNK", chunk_grow, chunk_sized);
  row("broker total", admit_grow + chunk_grow, admit_sized + chunk_sized);
  return 0;
}
