#pragma once
// WorkerOptions: everything ferry-worker is configured with, and the flag parser that fills it.
// Every field is one flag; `ferry-worker --help` lists them (docs/operations.md documents them).

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"
#include "ferry/worker/model_config.h"

namespace ferry::worker {

// A --model NAME=PATH is a ModelConfig with every other field at its default.
using ModelSpec = ModelConfig;

struct WorkerOptions {
  std::string broker = "tcp://127.0.0.1:5556";  // the broker's backend ROUTER
  // CurveZMQ (docs/security.md): the broker's public certificate (its NAME.key) and this
  // worker's secret certificate (NAME.key_secret, listed in the broker's --allow-workers).
  std::string curve_server_public;
  std::string curve_secret;
  std::string redis = "redis://127.0.0.1:6379";
  // --redis-password-file, --redis-tls-ca/-cert/-key (docs/security.md).
  protocol::RedisAccessFiles redis_files;
  // At least one, from --models FILE and/or --model NAME=PATH; after parsing, every entry's
  // device and max_batch are filled in from --device and --max-batch when the file left them.
  std::vector<ModelConfig> models;
  std::string models_file;       // --models: the repository file, if any
  int64_t memory_budget = 0;     // bytes for resident models; 0 = unlimited
  std::string device = "cpu";    // cpu | cuda | cuda:N
  int64_t max_batch = 32;        // jobs per forward, per model
  int64_t instances = 1;         // executor threads
  int64_t threads = 0;           // intra-op torch threads; 0 = cores / instances
  bool flush_denormals = false;  // CPU: float denormals read and written as zero (FTZ/DAZ)
  std::string redis_prefix = std::string(protocol::kDefaultPrefix);
  std::string name;  // "" = host:pid:device
  int64_t heartbeat_ms = 1000;
  int64_t liveness = 3;  // a broker silent for heartbeat_ms * liveness is presumed dead
  int64_t result_ttl_s = protocol::kDefaultResultTtlS;  // for jobs whose result_ttl_s is 0
  int64_t inline_result_bytes = 16384;  // results up to this size also ride in DONE; 0 = none
  std::string log_level = "info";
  bool log_json = false;     // --log-json: one JSON object per log line
  int64_t metrics_port = 0;  // serve /metrics and /healthz here; 0 = off, -1 = any free port
  std::string metrics_addr = "127.0.0.1";  // the address /metrics binds

  // Jobs the worker can hold at once (its credit): the largest max batch of its models times
  // (instances + 1), so the broker sends the next chunk while the current ones compute.
  int64_t capacity() const {
    int64_t largest = models.empty() ? max_batch : 1;
    for (const auto& m : models) {
      const int64_t b = m.max_batch > 0 ? m.max_batch : max_batch;
      largest = b > largest ? b : largest;
    }
    return largest * (instances + 1);
  }
};

// Fills each model's empty device and zero max_batch from --device and --max-batch.
void ResolveModelDefaults(WorkerOptions* options);

// Parses argv. Returns kInvalidArgument (message for stderr) on an unknown flag, a positional
// argument or a bad value; sets *help and returns OK on --help (the usage is in *usage either
// way). Fills in the derived defaults (name, threads).
Status ParseWorkerFlags(int argc, char** argv, WorkerOptions* out, bool* help, std::string* usage);

}  // namespace ferry::worker
