#pragma once
// Broker: ferry-broker's event loop. One thread, one zmq::poll over two ROUTER sockets --
// the frontend (producers: SUBMIT, STATS) and the backend (workers: READY, DONE, HEARTBEAT,
// BYE) -- and a Scheduler that owns all state. Nothing is shared between threads, so there
// are no locks (libzmq's io_thread_t and Envoy's Dispatcher work the same way).
//
// Create() binds the sockets and, with the journal on, restores the jobs journaled in Redis by
// an earlier broker (it fails with `unavailable` when Redis cannot be read then); Run() loops
// until Stop(); Stop() is async-signal-safe and may be called from any thread or a signal
// handler. After Stop, Run writes what it owes Redis, answers what it read, and returns: queued
// jobs stay in the journal for the next broker.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"

namespace ferry::broker {

struct BrokerOptions {
  // Loopback by default: binding beyond it needs CURVE (below) or `insecure`.
  std::string frontend = "tcp://127.0.0.1:5555";
  std::string backend = "tcp://127.0.0.1:5556";
  std::string redis = "redis://127.0.0.1:6379";
  std::string redis_prefix = "ferry:";
  // --redis-password-file, --redis-tls-ca/-cert/-key (docs/security.md). A Redis that refuses
  // the credentials, the TLS files or the database fails Create (`unavailable`).
  protocol::RedisAccessFiles redis_files;
  int64_t heartbeat_ms = 1000;  // interval of HEARTBEATs to workers
  int64_t liveness = 3;         // a worker silent for heartbeat_ms * liveness is dropped
  int64_t max_attempts = 3;     // a job requeued this many times fails as "poisoned"
  // --result-ttl-s: expiry of results whose job sets none. 10 minutes, which a busy fleet's Redis
  // survives (36k jobs/s x ~490 B x 600 s = ~10.6 GB; docs/operations.md, "Result retention and
  // Redis sizing"); jobs that must be read later ask for more with result_ttl_s.
  int64_t default_result_ttl_s = protocol::kDefaultResultTtlS;
  int64_t max_job_bytes = 64 << 20;  // larger jobs are rejected with too_large
  // Larger messages drop the connection (ZeroMQ): the largest job plus room for its envelope,
  // so that nobody makes the broker allocate much more than one job's worth at once.
  int64_t max_message_bytes = (64 << 20) + (1 << 20);
  // Queued jobs per model before queue_full; also the most results of jobs the broker ended
  // (cancelled, expired, ...) that may wait for Redis before SUBMITs are rejected unavailable.
  int64_t max_queue = 10000;
  int64_t max_pending_bytes = 1ll << 30;  // input bytes of all pending jobs before queue_full
  int64_t aging_every = 8;                // every Nth chunk of a model is served oldest-first
  bool journal = true;                    // journal accepted jobs in Redis (--no-journal)
  int64_t redis_timeout_ms = 1000;
  int metrics_port = 0;  // serve /metrics and /healthz here; 0 = off, -1 = any free port
  std::string metrics_addr = "127.0.0.1";  // the address /metrics binds

  // CurveZMQ (docs/security.md). `curve_secret`, the broker's own NAME.key_secret, makes both
  // sockets CURVE servers; then only clients whose public key is a *.key file in
  // `allow_producers` (frontend) or `allow_workers` (backend) get in, and `allow_operators`
  // (optional) lists producers that may also cancel any producer's jobs. Re-read on Reload().
  std::string curve_secret;
  std::string allow_producers;
  std::string allow_workers;
  std::string allow_operators;
  // Bind a non-loopback address without CURVE (anyone who reaches the ports is a member).
  bool insecure = false;

  // Bounds on what one message may ask for (a member can misbehave too).
  int64_t max_result_ttl_s = 7 * 24 * 3600;  // SUBMIT result_ttl_s above it: invalid_argument
  int64_t max_jobs_per_message = 10000;      // jobs per SUBMIT, ids per CANCEL (protocol's
                                             // kMaxJobsPerMessage: the clients split at it)
  // Replies queued for one producer connection and not yet written out; past it, FINISHED
  // carries ids only, and 64 MiB past it replies are dropped, until the producer reads
  // (src/reply_backlog.h).
  int64_t max_inline_backlog_bytes = int64_t{64} << 20;

  // Queued jobs of a model that no connected worker serves fail `unavailable` once the model
  // has had no worker for this long (SUBMITs for it are still accepted: a worker may come
  // back). 0: never (jobs wait for a worker without limit). See docs/operations.md.
  int64_t orphan_timeout_s = 300;
};

// Checks that every option is in its range; invalid_argument naming the flag that sets it
// (e.g. "--heartbeat-ms must be 10..600000, got 0"). Create calls it.
Status ValidateBrokerOptions(const BrokerOptions& options);

class Broker {
 public:
  static Status Create(const BrokerOptions& options, std::unique_ptr<Broker>* out);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // Serves until Stop(). Returns OK after a clean stop.
  Status Run();
  void Stop() { stop_.store(true, std::memory_order_relaxed); }
  // Re-reads the allowed-key directories on the broker's thread, soon (SIGHUP). Async-signal-safe.
  void Reload() { reload_.store(true, std::memory_order_relaxed); }

  // The endpoints actually bound (resolves port 0 / wildcards), for tests and logs.
  std::string frontend_endpoint() const;
  std::string backend_endpoint() const;
  // The port /metrics is served on; 0 when off.
  int metrics_port() const;

 private:
  struct Impl;
  explicit Broker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> reload_{false};
};

}  // namespace ferry::broker
