#include "ferry/worker/options.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "ferry/protocol/util.h"
#include "ferry/runtime/flags.h"
#include "ferry/runtime/redis_flags.h"

namespace ferry::worker {
namespace {

Status ParseModel(const std::string& spec, ModelSpec* out) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    return Status::InvalidArgument("--model wants NAME=PATH.pt, got \"" + spec + "\"");
  out->name = spec.substr(0, eq);
  out->path = spec.substr(eq + 1);
  Status s = ValidateModelConfig(*out);
  if (!s.ok()) return Status::InvalidArgument("--model " + spec + ": " + s.message());
  return Status::Ok();
}

bool ValidDevice(const std::string& d) {
  if (d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5 || d.size() > 8) return false;
  for (size_t i = 5; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') return false;
  }
  return true;
}

}  // namespace

void ResolveModelDefaults(WorkerOptions* options) {
  for (ModelConfig& m : options->models) {
    if (m.device.empty()) m.device = options->device;
    if (m.max_batch == 0) m.max_batch = options->max_batch;
  }
}

Status ParseWorkerFlags(int argc, char** argv, WorkerOptions* out, bool* help, std::string* usage) {
  *help = false;
  WorkerOptions& o = *out;
  std::vector<std::string> models;
  std::string memory_budget = "0";
  runtime::FlagSet flags("ferry-worker",
                         "Runs TorchScript models on batches of jobs pulled from a Ferry broker "
                         "and writes the results to Redis.");
  flags.String("broker", &o.broker, "the broker's backend endpoint");
  flags.String("curve-server-public", &o.curve_server_public,
               "CURVE: the broker's public certificate (its NAME.key)");
  flags.String("curve-secret", &o.curve_secret,
               "CURVE: this worker's secret certificate (NAME.key_secret, listed in the broker's "
               "--allow-workers)");
  flags.String("redis", &o.redis,
               "Redis for results, redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or unix:///PATH");
  runtime::AddRedisAccessFlags(&flags, &o.redis_files);
  flags.Repeated("model", &models,
                 "a model to serve, NAME=PATH.pt (TorchScript; shorthand for "
                 "a --models entry with defaults)");
  flags.String("models", &o.models_file, "a model repository file (TOML, docs/models.md)");
  flags.String("device", &o.device, "cpu, cuda or cuda:N (models without a device of their own)");
  flags.Int("max-batch", &o.max_batch,
            "most jobs per call (models without max_batch of their own)");
  flags.String("memory-budget", &memory_budget,
               "memory for resident models, e.g. 20G or 512M (0: unlimited); least recently "
               "used idle models are unloaded to make room");
  flags.Int("instances", &o.instances,
            "executor threads running batches concurrently (one CUDA stream each)");
  flags.Int("threads", &o.threads, "intra-op torch threads (0: hardware cores / instances)");
  flags.Bool("flush-denormals", &o.flush_denormals,
             "CPU inference threads treat float denormals (below 1.2e-38) as zero: much faster "
             "where values underflow, but results then differ from PyTorch's in those values");
  flags.String("redis-prefix", &o.redis_prefix, "prefix of every Redis key");
  flags.String("name", &o.name, "worker name, unique in the fleet (default: host:pid:device)");
  flags.Int("heartbeat-ms", &o.heartbeat_ms, "interval of heartbeats to the broker");
  flags.Int("liveness", &o.liveness,
            "heartbeats the broker may miss before the worker reconnects and re-announces");
  flags.Int("result-ttl-s", &o.result_ttl_s, "expiry of results whose job sets none");
  flags.Int("inline-result-bytes", &o.inline_result_bytes,
            "results up to this many bytes also travel in DONE, for the broker to hand to "
            "their producer in FINISHED (saves the producer a Redis read); 0 = never");
  flags.String("metrics-addr", &o.metrics_addr,
               "address /metrics binds (0.0.0.0: all; it serves counts and model names, no job "
               "data)");
  flags.Int("metrics-port", &o.metrics_port,
            "serve Prometheus /metrics and /healthz on this port (0 = off; 9460 + GPU index "
            "in deploy/)");
  flags.Bool("log-json", &o.log_json, "log one JSON object per line");
  flags.String("log-level", &o.log_level, "trace, debug, info, warn, error or critical");
  Status s = flags.Parse(argc, argv);
  *usage = flags.Usage();
  if (!s.ok()) return s;
  if (flags.help_requested() || flags.version_requested()) {  // main prints *usage, exits 0
    *help = true;
    if (flags.version_requested()) *usage = flags.VersionLine() + "\n";
    return Status::Ok();
  }
  if (!flags.positional().empty())
    return Status::InvalidArgument("unexpected argument \"" + flags.positional()[0] + "\"");

  o.models.clear();
  if (!o.models_file.empty()) FERRY_RETURN_IF_ERROR(ParseModelRepository(o.models_file, &o.models));
  if (models.empty() && o.models.empty())
    return Status::InvalidArgument("at least one --model NAME=PATH.pt or --models FILE needed");
  for (const auto& m : models) {
    ModelSpec spec;
    FERRY_RETURN_IF_ERROR(ParseModel(m, &spec));
    o.models.push_back(std::move(spec));
  }
  for (size_t i = 0; i < o.models.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (o.models[i].name == o.models[j].name)
        return Status::InvalidArgument("model \"" + o.models[i].name + "\" given twice");
    }
  }
  FERRY_RETURN_IF_ERROR(ParseByteSize(memory_budget, &o.memory_budget));
  if (o.broker.empty()) return Status::InvalidArgument("--broker must not be empty");
  if (o.curve_server_public.empty() != o.curve_secret.empty())
    return Status::InvalidArgument(
        "--curve-server-public and --curve-secret go together (CURVE needs both)");
  protocol::RedisEndpoint endpoint;
  FERRY_RETURN_IF_ERROR(protocol::ResolveRedisEndpoint(o.redis, o.redis_files, &endpoint));
  if (!ValidDevice(o.device))
    return Status::InvalidArgument("--device must be cpu, cuda or cuda:N, got \"" + o.device +
                                   "\"");
  if (o.max_batch < 1 || o.max_batch > 65536)
    return Status::InvalidArgument("--max-batch must be 1..65536");
  if (o.instances < 1 || o.instances > 64)
    return Status::InvalidArgument("--instances must be 1..64");
  if (o.threads < 0 || o.threads > 1024)
    return Status::InvalidArgument("--threads must be 0..1024");
  if (o.heartbeat_ms < 10 || o.heartbeat_ms > 600000)
    return Status::InvalidArgument("--heartbeat-ms must be 10..600000");
  if (o.liveness < 1 || o.liveness > 1000)
    return Status::InvalidArgument("--liveness must be 1..1000");
  if (o.result_ttl_s < 1) return Status::InvalidArgument("--result-ttl-s must be >= 1");
  if (o.inline_result_bytes < 0 || o.inline_result_bytes > (int64_t{64} << 20))
    return Status::InvalidArgument("--inline-result-bytes must be 0..67108864");
  if (o.metrics_port < 0 || o.metrics_port > 65535)
    return Status::InvalidArgument("--metrics-port must be 0..65535");
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool level_ok = false;
  for (const char* l : kLevels) level_ok = level_ok || o.log_level == l;
  if (!level_ok) return Status::InvalidArgument("bad --log-level \"" + o.log_level + "\"");

  ResolveModelDefaults(&o);
  for (ModelConfig& m : o.models) {
    if (!ValidDevice(m.device))
      return Status::InvalidArgument("model \"" + m.name +
                                     "\": device must be cpu, cuda or cuda:N");
    if (m.half && m.device == "cpu")
      return Status::InvalidArgument("model \"" + m.name +
                                     "\": half precision needs a CUDA device");
  }

  // CPU rule: executors x intra-op threads = the cores, so that concurrent batches do not
  // oversubscribe them.
  if (o.threads == 0) {
    int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    o.threads = std::max<int64_t>(1, cores / o.instances);
  }
  if (o.name.empty()) {
    o.name = protocol::HostName() + ":" + std::to_string(getpid()) + ":" + o.device;
  }
  return Status::Ok();
}

}  // namespace ferry::worker
