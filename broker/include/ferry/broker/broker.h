#pragma once
// Broker: ferry-broker's event loop. One thread, one zmq::poll over two ROUTER sockets --
// the frontend (producers: SUBMIT, STATS) and the backend (workers: READY, DONE, HEARTBEAT,
// BYE) -- and a Scheduler that owns all state. Nothing is shared between threads, so there
// are no locks (libzmq's io_thread_t and Envoy's Dispatcher work the same way).
//
// Create() binds the sockets and connects to Redis; Run() loops until Stop(); Stop() is
// async-signal-safe and may be called from any thread or a signal handler.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::broker {

struct BrokerOptions {
  std::string frontend = "tcp://*:5555";
  std::string backend = "tcp://*:5556";
  std::string redis = "redis://127.0.0.1:6379";
  std::string redis_prefix = "ferry:";
  int64_t heartbeat_ms = 1000;  // interval of HEARTBEATs to workers
  int64_t liveness = 3;         // a worker silent for heartbeat_ms * liveness is dropped
  int64_t max_attempts = 3;     // a job requeued this many times fails as "poisoned"
  int64_t default_result_ttl_s = 3600;
  int64_t max_job_bytes = 64 << 20;        // larger jobs are rejected with too_large
  int64_t max_message_bytes = 256 << 20;   // larger messages drop the connection (ZeroMQ)
};

class Broker {
 public:
  static Status Create(const BrokerOptions& options, std::unique_ptr<Broker>* out);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // Serves until Stop(). Returns OK after a clean stop.
  Status Run();
  void Stop() { stop_.store(true, std::memory_order_relaxed); }

  // The endpoints actually bound (resolves port 0 / wildcards), for tests and logs.
  std::string frontend_endpoint() const;
  std::string backend_endpoint() const;

 private:
  struct Impl;
  explicit Broker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace ferry::broker
