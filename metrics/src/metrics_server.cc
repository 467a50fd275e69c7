// The only files that include <httplib.h> are this one and http_get.cc.
#include "ferry/metrics/metrics_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "ferry/metrics/registry.h"

namespace ferry::metrics {

class MetricsServer::Impl {
 public:
  httplib::Server server;
  std::thread thread;
};

Status MetricsServer::Start(const Registry* registry, const MetricsServerOptions& options,
                            std::unique_ptr<MetricsServer>* out) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  if (options.port == 0) {  // disabled
    *out = std::move(s);
    return Status::Ok();
  }
  if (options.port < kAnyPort || options.port > 65535)
    return Status::InvalidArgument("metrics port out of range: " + std::to_string(options.port));

  s->impl_ = std::make_unique<Impl>();
  httplib::Server& server = s->impl_->server;
  // Two handler threads are plenty for scrapes (httplib defaults to max(8, cores - 1)).
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second process
  // (say, two workers given the same --metrics-port) bind the port too and split the scrapes.
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_keep_alive_max_count(100);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  auto before = options.before_scrape;
  server.Get("/metrics", [registry, before](const httplib::Request&, httplib::Response& res) {
    if (before) before();
    res.set_content(registry->Expose(), "text/plain; version=0.0.4; charset=utf-8");
  });
  enum Level { kLive, kHealthy, kReady };
  auto check = [health = options.health, depends = options.depends, ready = options.ready](
                   Level level, httplib::Response& res) {
    std::string why;
    const bool ok = (!health || health(&why)) && (level < kHealthy || !depends || depends(&why)) &&
                    (level < kReady || !ready || ready(&why));
    if (!ok) {
      res.status = 503;
      res.set_content(why.empty() ? "unhealthy\n" : why + "\n", "text/plain");
      return;
    }
    res.set_content("ok\n", "text/plain");
  };
  server.Get("/livez",
             [check](const httplib::Request&, httplib::Response& res) { check(kLive, res); });
  server.Get("/healthz",
             [check](const httplib::Request&, httplib::Response& res) { check(kHealthy, res); });
  server.Get("/readyz",
             [check](const httplib::Request&, httplib::Response& res) { check(kReady, res); });

  int port = options.port;
  if (port == kAnyPort) {
    port = server.bind_to_any_port(options.bind_address);
    if (port < 0) return Status::Unavailable("metrics: cannot bind " + options.bind_address);
  } else if (!server.bind_to_port(options.bind_address, port)) {
    return Status::Unavailable("metrics: cannot bind " + options.bind_address + ":" +
                               std::to_string(port));
  }
  s->port_ = port;
  s->impl_->thread = std::thread([&server] { server.listen_after_bind(); });
  // Return only once the accept loop runs: stop() before that would be lost.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      s->impl_->thread.detach();  // cannot happen in practice; never block the caller forever
      s->impl_.release();         // leaked on purpose: the thread may still touch it
      return Status::Internal("metrics: the HTTP server did not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *out = std::move(s);
  return Status::Ok();
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (!impl_) return;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_.reset();
  port_ = 0;
}

}  // namespace ferry::metrics
