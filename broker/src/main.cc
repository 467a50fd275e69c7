// ferry-broker: parse flags, Create, Run. See docs/operations.md for every flag.
#include <csignal>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "ferry/broker/broker.h"
#include "ferry/runtime/flags.h"
#include "ferry/runtime/logging.h"
#include "ferry/runtime/malloc_policy.h"
#include "ferry/runtime/redis_flags.h"

namespace {
ferry::broker::Broker* g_broker = nullptr;
void OnSignal(int) {
  if (g_broker) g_broker->Stop();
}
void OnHangup(int) {
  if (g_broker) g_broker->Reload();
}
}  // namespace

int main(int argc, char** argv) {
  ferry::broker::BrokerOptions o;
  std::string log_level = "info";
  ferry::runtime::FlagSet flags("ferry-broker",
                                "Accepts jobs from producers and feeds them to GPU workers.");
  flags.String("frontend", &o.frontend, "ZeroMQ endpoint for producers (ROUTER, bind)");
  flags.String("backend", &o.backend, "ZeroMQ endpoint for workers (ROUTER, bind)");
  flags.String("redis", &o.redis,
               "Redis URL of the result store, redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or "
               "unix:///PATH");
  ferry::runtime::AddRedisAccessFlags(&flags, &o.redis_files);
  flags.String("redis-prefix", &o.redis_prefix, "prefix of every Redis key Ferry writes");
  flags.Int("heartbeat-ms", &o.heartbeat_ms, "interval of heartbeats to workers");
  flags.Int("liveness", &o.liveness, "heartbeats a worker may miss before it is dropped");
  flags.Int("max-attempts", &o.max_attempts,
            "dispatches of a job whose workers died before it fails as poisoned");
  flags.Int("result-ttl-s", &o.default_result_ttl_s, "default expiry of results in Redis");
  flags.Int("max-job-bytes", &o.max_job_bytes, "largest accepted job (sum of its inputs)");
  flags.Int("max-message-bytes", &o.max_message_bytes,
            "largest ZeroMQ message frame (a peer sending more is disconnected), and largest "
            "SUBMIT with its data frames (more: ERROR too_large)");
  flags.Int("max-queue", &o.max_queue,
            "queued jobs per model; beyond it SUBMIT rejects with queue_full");
  flags.Int("max-pending-bytes", &o.max_pending_bytes,
            "input bytes of all pending jobs; beyond it SUBMIT rejects with queue_full");
  flags.Int("aging-every", &o.aging_every,
            "every Nth chunk of a model takes its oldest jobs, whatever their priority (0: off)");
  bool no_journal = false;
  flags.Bool("no-journal", &no_journal,
             "do not journal accepted jobs in Redis (faster; a broker crash loses queued jobs)");
  flags.Int("redis-timeout-ms", &o.redis_timeout_ms, "timeout of each Redis round trip");
  int64_t metrics_port = 0;
  flags.Int("metrics-port", &metrics_port,
            "serve Prometheus /metrics and /healthz on this port (0 = off; 9450 in deploy/)");
  flags.String("metrics-addr", &o.metrics_addr,
               "address /metrics binds (0.0.0.0: all; it serves counts and model names, no job "
               "data)");
  flags.String("curve-secret", &o.curve_secret,
               "this broker's CURVE secret certificate (NAME.key_secret from `ferry keygen`): "
               "CURVE on both sockets");
  flags.String("allow-producers", &o.allow_producers,
               "directory of the producers' public certificates (*.key) allowed on the frontend");
  flags.String("allow-workers", &o.allow_workers,
               "directory of the workers' public certificates (*.key) allowed on the backend");
  flags.String("allow-operators", &o.allow_operators,
               "directory of operators' public certificates: producers that may cancel any job");
  flags.Bool("insecure", &o.insecure,
             "allow binding a non-loopback address without CURVE (anyone reaching the ports is a "
             "member)");
  flags.Int("max-result-ttl-s", &o.max_result_ttl_s,
            "largest result_ttl_s a SUBMIT may ask for (larger: invalid_argument)");
  flags.Int("max-jobs-per-message", &o.max_jobs_per_message,
            "most jobs in one SUBMIT and ids in one CANCEL (more: the message fails too_large)");
  flags.Int("max-inline-backlog-bytes", &o.max_inline_backlog_bytes,
            "replies queued for one producer connection and not yet read; beyond it, "
            "FINISHED notices carry ids only (the producer reads those results from Redis), "
            "and 64 MiB beyond it replies are dropped");
  flags.Int("orphan-timeout-s", &o.orphan_timeout_s,
            "queued jobs of a model that no connected worker serves fail `unavailable` after "
            "this long without one (0: they wait forever)");
  bool log_json = false;
  flags.Bool("log-json", &log_json, "log one JSON object per line");
  flags.String("log-level", &log_level, "trace, debug, info, warn, error");
  int rc = ferry::runtime::HandleFlagResult(flags, flags.Parse(argc, argv));
  if (rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "ferry-broker: unexpected argument \"%s\"\n",
                 flags.positional()[0].c_str());
    return 2;
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    std::fprintf(stderr, "ferry-broker: --metrics-port must be 0..65535, got %lld\n",
                 static_cast<long long>(metrics_port));
    return 2;
  }
  ferry::Status ls = ferry::logging::Configure(log_level, log_json, "broker");
  if (!ls.ok()) {
    std::fprintf(stderr, "ferry-broker: --log-level: %s\n", ls.message().c_str());
    return 2;
  }
  o.metrics_port = static_cast<int>(metrics_port);
  o.journal = !no_journal;
  if (ferry::Status v = ferry::broker::ValidateBrokerOptions(o); !v.ok()) {
    std::fprintf(stderr, "ferry-broker: %s\n", v.message().c_str());
    return 2;
  }

  std::string malloc_policy;
  ferry::runtime::KeepFreedMemory(&malloc_policy);  // big jobs: no page faults per buffer
  spdlog::info("{}", malloc_policy);

  std::unique_ptr<ferry::broker::Broker> broker;
  ferry::Status s = ferry::broker::Broker::Create(o, &broker);
  if (!s.ok()) {
    spdlog::critical("cannot start: {}", s.ToString());
    return s.code() == ferry::codes::kInvalidArgument ? 2 : 1;
  }
  g_broker = broker.get();
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGHUP, OnHangup);
  s = broker->Run();
  g_broker = nullptr;
  if (!s.ok()) {
    spdlog::critical("broker failed: {}", s.ToString());
    return 1;
  }
  return 0;
}
