#pragma once
// MetricsServer: serves a Registry over HTTP/1.x on its own thread (poll(2); no library):
//   GET /metrics  -> 200, Registry::Expose(), Content-Type text/plain; version=0.0.4
//   GET /livez    -> 200 "ok", or 503 and the reason when options.health says the process is
//                    stuck (a liveness probe: restart it)
//   GET /healthz  -> also 503 and the reason when options.depends says what the process needs
//                    is unreachable (Redis)
//   GET /readyz   -> also 503 and the reason when options.ready says it cannot serve yet (a
//                    worker not connected to a broker): a readiness probe
// HEAD too; another method gets 405, another path 404. Every answer closes its connection. A
// client has 5 s for its whole exchange and 16 KiB for its request head (else 431); no body is
// read; at most 64 connections are open: slow or hostile clients cannot hold the probes or grow
// the process. The server only reads the registry; the process updates metrics from its own
// threads as usual.
//
//   MetricsServerOptions options;
//   options.port = metrics_port;  // --metrics-port
//   std::unique_ptr<MetricsServer> server;
//   FERRY_RETURN_IF_ERROR(MetricsServer::Start(&registry, options, &server));
//   ...                       // server->port() is 0 when disabled (port 0)
//   server->Stop();           // or let the destructor do it
//
// Thread-safety: Start/Stop/port from one owning thread; the callbacks run on the server's
// thread and must be thread-safe (and quick: one request at a time).

#include <functional>
#include <memory>
#include <string>

#include "ferry/status.h"

namespace ferry::metrics {

class Registry;

struct MetricsServerOptions {
  // TCP port. 0 = disabled (Start succeeds, serves nothing). kAnyPort = pick a free one (tests).
  int port = 0;
  std::string bind_address = "0.0.0.0";
  // Optional, each called on a server thread; return false and set *why for a 503.
  // health: /livez, /healthz and /readyz -- the process is stuck.
  std::function<bool(std::string* why)> health;
  // depends: /healthz and /readyz -- what the process needs is unreachable (Redis).
  std::function<bool(std::string* why)> depends;
  // ready: /readyz only -- the process cannot serve yet (a worker without a broker).
  std::function<bool(std::string* why)> ready;
  // Optional: called on a server thread before each /metrics render, e.g. to sample device
  // memory. Must not touch state owned by another thread without synchronisation.
  std::function<void()> before_scrape;
};

inline constexpr int kAnyPort = -1;

class MetricsServer {
 public:
  // Binds, starts the server thread and returns once it accepts connections. Fails with
  // unavailable when the port cannot be bound (in use, no permission), invalid_argument on a port
  // out of range. `registry` must outlive the server.
  static Status Start(const Registry* registry, const MetricsServerOptions& options,
                      std::unique_ptr<MetricsServer>* out);

  ~MetricsServer();  // Stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Stops accepting, closes the open connections and joins the thread. Idempotent.
  void Stop();
  // The bound port; 0 when disabled.
  int port() const { return port_; }

 private:
  class Impl;
  MetricsServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// GET http://HOST:PORT/PATH (plain HTTP only; for scraping /metrics in `ferry top` and tests).
// Fails with unavailable when the server cannot be reached or answers non-200.
Status HttpGet(const std::string& url, int timeout_ms, std::string* body);

}  // namespace ferry::metrics
