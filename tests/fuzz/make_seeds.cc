// Writes the seed corpus of every target in tests/fuzz: small, real examples made by Ferry's own
// encoders (the SDK's SUBMIT, the broker's CHUNK and journal records, the worker's READY, DONE
// and result records, ...). Usage: ferry_fuzz_seeds OUTDIR (tests/fuzz/corpus in the repository;
// `make fuzz-seeds`). Each file is OUTDIR/<target>/<name>.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "journal.h"
#include "npy.h"

namespace {

namespace protocol = ferry::protocol;
using ferry::DType;
using ferry::Tensor;

std::string g_out;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_out + "/" + target;
  mkdir(g_out.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}
std::string Bytes(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}
std::string Bytes(const msgpack::sbuffer& b) { return std::string(b.data(), b.size()); }

Tensor Floats(std::vector<float> v, std::vector<int64_t> shape) {
  return Tensor::From<float>(v, std::move(shape), DType::kFloat32);
}
Tensor Pcm() {  // 16 samples of int16 audio
  std::vector<int16_t> v(16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int16_t>(i * 1000 - 8000);
  return Tensor::From<int16_t>(v, {16}, DType::kInt16);
}
Tensor Pixels() {  // a 2x2 RGB uint8 image
  return Tensor::From<uint8_t>({0, 64, 128, 255, 1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 3}, DType::kUInt8);
}
Tensor Scalar() { return Tensor::From<int64_t>({42}, {}, DType::kInt64); }

std::string PackedTensor(const Tensor& t) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackTensor(pk, t);
  return Bytes(buf);
}

// The inputs array of a job, as SUBMIT carries it (and the broker keeps it: inputs_raw).
std::string PackedInputs(const std::vector<Tensor>& inputs, const std::vector<bool>& stored,
                         const std::vector<bool>& attached = {}) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_array(static_cast<uint32_t>(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < stored.size() && stored[i])
      protocol::PackStoredTensor(pk, inputs[i].dtype, inputs[i].shape);
    else if (i < attached.size() && attached[i])
      protocol::PackAttachedTensor(pk, inputs[i].dtype, inputs[i].shape);
    else
      protocol::PackTensor(pk, inputs[i]);
  }
  return Bytes(buf);
}

void Tensors() {
  Write("fuzz_tensor", "float32_2x3", PackedTensor(Floats({1, 2, 3, 4, 5, 6}, {2, 3})));
  Write("fuzz_tensor", "int16_pcm", PackedTensor(Pcm()));
  Write("fuzz_tensor", "uint8_image", PackedTensor(Pixels()));
  Write("fuzz_tensor", "int64_scalar", PackedTensor(Scalar()));
  Write("fuzz_tensor", "bool_empty", PackedTensor(Tensor::From<uint8_t>({}, {0, 4}, DType::kBool)));
  msgpack::sbuffer stored;
  protocol::Packer pk(stored);
  protocol::PackStoredTensor(pk, DType::kInt16, {480000});
  Write("fuzz_tensor", "stored_int16", Bytes(stored));
  msgpack::sbuffer attached;
  protocol::Packer apk(attached);
  protocol::PackAttachedTensor(apk, DType::kFloat32, {2, 3});
  Write("fuzz_tensor", "attached_float32", Bytes(attached));
  msgpack::sbuffer list;
  protocol::Packer lpk(list);
  lpk.pack_map(1);
  protocol::PackString(lpk, "inputs");
  const std::string inputs = PackedInputs({Floats({1, 2}, {2}), Pcm()}, {false, true});
  list.write(inputs.data(), inputs.size());
  Write("fuzz_tensor", "inputs_list", Bytes(list));
}

// A SUBMIT body the way the SDK packs it (producer-sdk/src/client_submit.cc).
std::string SubmitBody(const std::vector<std::vector<Tensor>>& jobs,
                       const std::vector<std::vector<bool>>& stored, bool notify, bool ack,
                       const std::vector<std::vector<bool>>& attached = {}) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(3 + (notify ? 1 : 0) + (ack ? 0 : 1));
  if (notify) {
    protocol::PackString(pk, "notify");
    protocol::PackString(pk,
                         protocol::Keys().NotifyChannel("2b1d0c1e-5c1f-4e9b-9a3e-1c0ffee00001"));
  }
  if (!ack) {
    protocol::PackString(pk, "ack");
    pk.pack_false();
  }
  protocol::PackString(pk, "inline_results");
  pk.pack_true();
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(jobs.size()));
  for (size_t i = 0; i < jobs.size(); ++i) {
    protocol::PackSubmitJob(pk, "job-" + std::to_string(i), i % 2 ? "whisper" : "tiny", jobs[i],
                            /*priority=*/static_cast<int64_t>(i) - 1,
                            /*timeout_ms=*/i == 1 ? 5000 : 0, /*result_ttl_s=*/i == 2 ? 600 : 0,
                            i < stored.size() ? stored[i] : std::vector<bool>{},
                            i < attached.size() ? attached[i] : std::vector<bool>{});
  }
  protocol::PackString(pk, "rid");
  pk.pack_int64(7);
  return Bytes(buf);
}

void Submit() {
  Write("fuzz_submit", "one_job",
        SubmitBody({{Floats({1, 2, 3, 4, 5, 6, 7, 8}, {8})}}, {}, false, true));
  Write("fuzz_submit", "three_jobs_notify",
        SubmitBody({{Floats({1, 2}, {2})}, {Pcm(), Scalar()}, {Pixels()}}, {}, true, true));
  Write("fuzz_submit", "stored_input_no_ack", SubmitBody({{Pcm()}}, {{true}}, false, false));
  // Attached inputs (their data frames are made by the target, of their sizes).
  Write("fuzz_submit", "attached_inputs",
        SubmitBody(
            {{Floats({1, 2, 3, 4, 5, 6, 7, 8}, {8})}, {Floats({1, 2}, {2}), Scalar()}, {Pcm()}},
            {{}, {}, {true}}, false, true, {{true}, {false, true}, {}}));
}

void Chunk() {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(3);
  protocol::PackChunkEntry(pk, "job-0", "tiny", PackedInputs({Floats({1, 2, 3, 4}, {4})}, {}), 1, 0,
                           3600, 1'700'000'000'000'000, 1'700'000'000'000'100);
  protocol::PackChunkEntry(pk, "job-1", "whisper", PackedInputs({Pcm()}, {true}), 2, 5, 600,
                           1'700'000'000'000'000, 1'700'000'000'000'200, 1'700'000'005'000'000,
                           protocol::Keys().NotifyChannel("token-1"));
  protocol::PackChunkEntry(pk, "job-2", "resnet", PackedInputs({Pixels(), Scalar()}, {}), 1, -3, 60,
                           1, 2);
  Write("fuzz_chunk", "three_entries", Bytes(buf));
  msgpack::sbuffer att;
  protocol::Packer apk(att);
  apk.pack_map(1);
  protocol::PackString(apk, "jobs");
  apk.pack_array(2);
  protocol::PackChunkEntry(apk, "job-a", "whisper", PackedInputs({Pcm()}, {}, {true}), 1, 0, 600, 1,
                           2);
  protocol::PackChunkEntry(apk, "job-b", "tiny",
                           PackedInputs({Floats({1, 2}, {2}), Pixels()}, {false, true}, {true}), 1,
                           0, 600, 1, 2);
  Write("fuzz_chunk", "attached_entries", Bytes(att));
}

// A result record the way the worker writes it (gpu-worker/src/result_writer.cc).
std::string Record(const std::string& id, bool done) {
  const Tensor out = Floats({0.5f, -1.25f, 3}, {3});
  protocol::ResultRecord r;
  r.id = id;
  r.status = done ? "done" : "failed";
  r.model = "tiny";
  r.worker = "host-a:4242:cpu";
  if (done) {
    protocol::TensorRef ref;
    ref.dtype = out.dtype;
    ref.shape = out.shape;
    ref.data = out.data.data();
    ref.size = out.data.size();
    r.outputs.push_back(ref);
  } else {
    r.error_code = ferry::codes::kModelError;
    r.error_message = "The size of tensor a (3) must match the size of tensor b (4)";
  }
  r.batch_size = 8;
  r.attempt = 1;
  r.timing_us = {{"submitted", 1'700'000'000'000'000},
                 {"dispatched", 1'700'000'000'000'100},
                 {"compute_start", 1'700'000'000'000'300},
                 {"finished", 1'700'000'000'000'900}};
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, r);
  return Bytes(buf);
}

void Results() {
  Write("fuzz_result", "done", Record("job-0", true));
  Write("fuzz_result", "failed", Record("job-1", false));
  protocol::ResultRecord c;
  c.id = "job-2";
  c.status = "cancelled";
  c.error_code = ferry::codes::kCancelled;
  c.error_message = "cancelled by request";
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, c);
  Write("fuzz_result", "cancelled", Bytes(buf));
}

void Done() {
  const std::string r0 = Record("job-0", true), r1 = Record("job-1", false);
  Write("fuzz_done", "ids_only", Bytes(protocol::EncodeDone({"job-0", "job-1"}, 0)));
  Write("fuzz_done", "everything",
        Bytes(protocol::EncodeDone({"job-0", "job-1", "job-2"}, 1, {{"job-1", "failed"}},
                                   {{"job-0", r0}, {"job-1", r1}}, {"job-2"}, true)));
  Write("fuzz_finished", "ids_only", Bytes(protocol::EncodeFinished({"job-0", "job-1"}, {})));
  Write("fuzz_finished", "inline_results",
        Bytes(protocol::EncodeFinished({"job-0", "job-1"}, {{"job-0", r0}, {"job-1", r1}})));
}

void Ready() {
  protocol::WorkerHello h;
  h.worker = "host-a:4242:cuda:0";
  h.device = "cuda:0";
  h.host = "host-a";
  h.pid = 4242;
  h.capacity = 96;
  h.models = {{"tiny", 32}, {"whisper", 16}};
  Write("fuzz_ready", "two_models", Bytes(protocol::EncodeHello(h)));
  h.resident = std::vector<std::string>{"tiny"};
  Write("fuzz_ready", "resident", Bytes(protocol::EncodeHello(h)));
  h.held = {"job-0", "job-1"};
  Write("fuzz_ready", "held", Bytes(protocol::EncodeHello(h)));
}

void Cancel() {
  Write("fuzz_cancel", "cancel", Bytes(protocol::EncodeIds({"job-0", "job-1"}, 9)));
  protocol::Cancelled c;
  c.rid = 9;
  c.ids = {"job-0"};
  c.running = {"job-1"};
  c.not_found = {"job-2"};
  Write("fuzz_cancel", "cancelled", Bytes(protocol::EncodeCancelled(c)));
}

void Accepted() {
  protocol::Accepted a;
  a.rid = 3;
  a.ids = {"job-0", "job-2"};
  a.rejected = {{"job-1", ferry::codes::kUnknownModel, "no worker serves model \"nope\""}};
  Write("fuzz_accepted", "accepted", Bytes(protocol::EncodeAccepted(a)));
  Write("fuzz_accepted", "error",
        Bytes(protocol::EncodeError(3, ferry::codes::kMalformed, "body is not valid msgpack")));
  Write("fuzz_accepted", "limits",
        Bytes(protocol::EncodeLimits({(64 << 20) + (1 << 20), 64 << 20, 10000}, 3)));
}

void Journal() {
  ferry::broker::Job j;
  j.id = "job-0";
  j.model = "tiny";
  j.priority = 2;
  j.timeout_ms = 5000;
  j.result_ttl_s = 3600;
  j.submitted_us = 1'700'000'000'000'000;
  j.deadline_us = 1'700'000'005'000'000;
  j.seq = 17;
  j.attempt = 2;
  j.inputs_raw = PackedInputs({Floats({1, 2, 3}, {3}), Pcm()}, {false, true});
  Write("fuzz_journal", "job", ferry::broker::Journal::Encode(j));
  j.inputs_raw = PackedInputs({Pixels()}, {});
  j.timeout_ms = 0;
  j.deadline_us = 0;
  Write("fuzz_journal", "image_job", ferry::broker::Journal::Encode(j));
}

void Npy() {
  for (const auto& [name, t] : std::vector<std::pair<std::string, Tensor>>{
           {"float32_2x3", Floats({1, 2, 3, 4, 5, 6}, {2, 3})},
           {"int16_pcm", Pcm()},
           {"uint8_image", Pixels()},
           {"int64_scalar", Scalar()}}) {
    std::string bytes;
    if (ferry::cli::EncodeNpy(t, &bytes).ok()) Write("fuzz_npy", name, bytes);
  }
}

void ModelConfig() {
  Write("fuzz_model_config", "minimal", "[models.tiny]\npath = \"/models/tiny.pt\"\n");
  Write("fuzz_model_config", "full",
        R"([models.resnet]
path = "/models/resnet18.pt"
device = "cuda:0"
max_batch = 64
method = "forward"
half = true
pinned = true
load = "lazy"
[[models.resnet.convert]]
input = 0
to = "float32"
scale = 0.00392156862745098
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
channel_dim = 2
[models.resnet.warmup]
batch_sizes = [1, 8, 64]
iterations = 2
[[models.resnet.warmup.inputs]]
dtype = "uint8"
shape = [224, 224, 3]

[models.whisper]
path = "/models/whisper.pt"
max_batch = 16
[models.whisper.padding]
inputs = [0]
dim = -1
value = 0
buckets = [80000, 160000, 480000]
lengths = true
[[models.whisper.padding.trim]]
output = 0
dim = 0
ratio = 0.5
)");
}

void Stats() {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(5);
  protocol::PackString(pk, "workers");
  pk.pack_array(1);
  pk.pack_map(10);
  for (const char* k : {"id", "device", "host"}) {
    protocol::PackString(pk, k);
    protocol::PackString(pk, std::string(k) == "device" ? "cpu" : "host-a:4242:cpu");
  }
  protocol::PackString(pk, "pid");
  pk.pack_int64(4242);
  protocol::PackString(pk, "models");
  pk.pack_array(2);
  protocol::PackString(pk, "tiny");
  protocol::PackString(pk, "whisper");
  protocol::PackString(pk, "resident");
  pk.pack_array(1);
  protocol::PackString(pk, "tiny");
  for (const char* k : {"capacity", "credit", "in_flight", "last_seen_ms"}) {
    protocol::PackString(pk, k);
    pk.pack_int64(12);
  }
  protocol::PackString(pk, "queues");
  protocol::PackIntMap(pk, {{"tiny", 3}, {"whisper", 0}});
  protocol::PackString(pk, "pending");
  pk.pack_uint64(3);
  protocol::PackString(pk, "counters");
  protocol::PackIntMap(pk, {{"accepted", 100}, {"rejected", 1}, {"finished", 96}});
  protocol::PackString(pk, "rid");
  pk.pack_int64(5);
  Write("fuzz_stats", "stats_msgpack", Bytes(buf));
  msgpack::object_handle oh;
  if (protocol::UnpackMap(buf.data(), buf.size(), &oh).ok())
    Write("fuzz_stats", "stats_json", protocol::ToJson(oh.get()));
}

void MetricsText() {
  namespace names = ferry::metrics::names;
  ferry::metrics::Registry r;
  r.Gauge(names::kWorkerInfo, names::kWorkerInfoHelp, {{names::kLabelWorker, "host-a:1:cpu"}})
      ->Set(1);
  r.Gauge(names::kExecutors, "executors")->Set(2);
  r.Counter(names::kExecutorBusy, "busy")->Add(1.5);
  r.Counter(names::kBatches, "batches")->Inc(40);
  r.Gauge(names::kQueueOldestAge, "age", {{names::kLabelModel, "tiny"}})->Set(0.25);
  auto* h = r.Histogram(names::kJobLatency, "latency", {0.001, 0.01, 0.1, 1},
                        {{names::kLabelModel, "tiny"}});
  for (double v : {0.0005, 0.002, 0.02, 0.5, 3.0}) h->Observe(v);
  Write("fuzz_metrics_text", "worker", r.Expose());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  Tensors();
  Submit();
  Chunk();
  Results();
  Done();
  Ready();
  Cancel();
  Accepted();
  Journal();
  Npy();
  ModelConfig();
  Stats();
  MetricsText();
  return 0;
}
