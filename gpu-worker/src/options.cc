#include "ferry/worker/options.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "ferry/protocol/flags.h"
#include "ferry/protocol/util.h"

namespace ferry::worker {
namespace {

Status ParseModel(const std::string& spec, ModelSpec* out) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    return Status::InvalidArgument("--model wants NAME=PATH.pt, got \"" + spec + "\"");
  out->name = spec.substr(0, eq);
  out->path = spec.substr(eq + 1);
  if (out->name.size() > 128)
    return Status::InvalidArgument("--model name must be 1-128 characters");
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

Status ParseWorkerFlags(int argc, char** argv, WorkerOptions* out, bool* help,
                        std::string* usage) {
  *help = false;
  WorkerOptions& o = *out;
  std::vector<std::string> models;
  protocol::FlagSet flags("ferry-worker",
                          "Runs TorchScript models on batches of jobs pulled from a Ferry broker "
                          "and writes the results to Redis.");
  flags.String("broker", &o.broker, "the broker's backend endpoint");
  flags.String("redis", &o.redis, "Redis for results, redis://HOST:PORT[/DB]");
  flags.Repeated("model", &models, "a model to serve, NAME=PATH.pt (TorchScript; at least one)");
  flags.String("device", &o.device, "cpu, cuda or cuda:N");
  flags.Int("max-batch", &o.max_batch, "most jobs per forward call");
  flags.Int("instances", &o.instances, "executor threads running batches concurrently");
  flags.Int("threads", &o.threads, "intra-op torch threads (0: hardware cores / instances)");
  flags.String("redis-prefix", &o.redis_prefix, "prefix of every Redis key");
  flags.String("name", &o.name, "worker name, unique in the fleet (default: host:pid:device)");
  flags.Int("heartbeat-ms", &o.heartbeat_ms, "interval of heartbeats to the broker");
  flags.Int("result-ttl-s", &o.result_ttl_s, "expiry of results whose job sets none");
  flags.String("log-level", &o.log_level, "trace, debug, info, warn, error or critical");
  Status s = flags.Parse(argc, argv);
  *usage = flags.Usage();
  if (!s.ok()) return s;
  if (flags.help_requested()) {
    *help = true;
    return Status::Ok();
  }
  if (!flags.positional().empty())
    return Status::InvalidArgument("unexpected argument \"" + flags.positional()[0] + "\"");

  if (models.empty()) return Status::InvalidArgument("at least one --model NAME=PATH.pt needed");
  o.models.clear();
  for (const auto& m : models) {
    ModelSpec spec;
    FERRY_RETURN_IF_ERROR(ParseModel(m, &spec));
    for (const auto& other : o.models) {
      if (other.name == spec.name)
        return Status::InvalidArgument("model \"" + spec.name + "\" given twice");
    }
    o.models.push_back(std::move(spec));
  }
  if (o.broker.empty()) return Status::InvalidArgument("--broker must not be empty");
  protocol::RedisEndpoint endpoint;
  FERRY_RETURN_IF_ERROR(protocol::ParseRedisUrl(o.redis, &endpoint));
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
  if (o.result_ttl_s < 1) return Status::InvalidArgument("--result-ttl-s must be >= 1");
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool level_ok = false;
  for (const char* l : kLevels) level_ok = level_ok || o.log_level == l;
  if (!level_ok) return Status::InvalidArgument("bad --log-level \"" + o.log_level + "\"");

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
