// MetricsServer scraped over a real TCP socket (plain POSIX, not the library's own client), plus
// HttpGet, /healthz, errors and clean start/stop.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/registry.h"
#include "ferry/metrics/text_format.h"

namespace ferry::metrics {
namespace {

// Sends a raw HTTP/1.0 request to 127.0.0.1:port and returns the whole response.
std::string RawRequest(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  send(fd, request.data(), request.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

std::string Body(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

std::unique_ptr<MetricsServer> StartOrDie(const Registry* r, MetricsServerOptions o = {}) {
  if (o.port == 0) o.port = kAnyPort;
  o.bind_address = "127.0.0.1";
  std::unique_ptr<MetricsServer> s;
  Status st = MetricsServer::Start(r, o, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

TEST(MetricsServer, ServesMetricsOverARealSocket) {
  Registry r;
  Counter* c = r.Counter("ferry_jobs_accepted_total", "Accepted.", {{"model", "tiny"}});
  c->Inc(5);
  auto server = StartOrDie(&r);
  ASSERT_GT(server->port(), 0);

  std::string resp = RawRequest(server->port(), "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
  ASSERT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
  EXPECT_NE(resp.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << resp;
  ParsedText p;
  ASSERT_TRUE(ParseText(Body(resp), &p).ok());
  EXPECT_EQ(SumSamples(p, "ferry_jobs_accepted_total", {{"model", "tiny"}}), 5);

  // Counters move between scrapes.
  c->Inc(2);
  std::string body;
  ASSERT_TRUE(
      HttpGet("http://127.0.0.1:" + std::to_string(server->port()) + "/metrics", 2000, &body).ok());
  ASSERT_TRUE(ParseText(body, &p).ok());
  EXPECT_EQ(SumSamples(p, "ferry_jobs_accepted_total"), 7);
  // host:port alone means /metrics.
  ASSERT_TRUE(HttpGet("127.0.0.1:" + std::to_string(server->port()), 2000, &body).ok());
  EXPECT_NE(body.find("ferry_jobs_accepted_total"), std::string::npos);

  EXPECT_EQ(RawRequest(server->port(), "GET /nope HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  server->Stop();
  server->Stop();  // idempotent
  EXPECT_EQ(server->port(), 0);
}

TEST(MetricsServer, HealthzAndBeforeScrapeHooks) {
  Registry r;
  Gauge* g = r.Gauge("ferry_device_memory_used_bytes", "used");
  std::atomic<bool> healthy{true};
  MetricsServerOptions o;
  o.health = [&](std::string* why) {
    if (!healthy) *why = "broker unreachable";
    return healthy.load();
  };
  o.before_scrape = [&] { g->Set(1234); };
  auto server = StartOrDie(&r, o);
  std::string resp = RawRequest(server->port(), "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(resp.rfind("HTTP/1.1 200", 0), 0u) << resp;
  EXPECT_EQ(Body(resp), "ok\n");
  healthy = false;
  resp = RawRequest(server->port(), "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(resp.rfind("HTTP/1.1 503", 0), 0u) << resp;
  EXPECT_EQ(Body(resp), "broker unreachable\n");
  EXPECT_NE(Body(RawRequest(server->port(), "GET /metrics HTTP/1.0\r\n\r\n"))
                .find("ferry_device_memory_used_bytes 1234"),
            std::string::npos);
}

TEST(MetricsServer, PortZeroIsDisabledAndBusyPortFails) {
  Registry r;
  std::unique_ptr<MetricsServer> off;
  MetricsServerOptions o;  // port 0
  ASSERT_TRUE(MetricsServer::Start(&r, o, &off).ok());
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(off->port(), 0);
  off->Stop();

  auto first = StartOrDie(&r);
  MetricsServerOptions same;
  same.port = first->port();
  same.bind_address = "127.0.0.1";
  std::unique_ptr<MetricsServer> second;
  Status s = MetricsServer::Start(&r, same, &second);
  EXPECT_EQ(s.code(), "unavailable") << s.ToString();
  same.port = 70000;
  EXPECT_EQ(MetricsServer::Start(&r, same, &second).code(), "invalid_argument");

  std::string body;
  EXPECT_EQ(HttpGet("https://127.0.0.1:1/metrics", 500, &body).code(), "invalid_argument");
}

TEST(MetricsServer, StopsCleanlyUnderConcurrentScrapesAndRestarts) {
  Registry r;
  r.Counter("ferry_x_total", "x")->Inc();
  for (int round = 0; round < 3; ++round) {
    auto server = StartOrDie(&r);
    int port = server->port();
    std::vector<std::thread> clients;
    for (int i = 0; i < 4; ++i) {
      clients.emplace_back([port] {
        for (int j = 0; j < 20; ++j) {
          std::string body;
          (void)HttpGet("http://127.0.0.1:" + std::to_string(port) + "/metrics", 1000, &body);
        }
      });
    }
    for (auto& t : clients) t.join();
    server.reset();  // destructor stops and joins
  }
}

}  // namespace
}  // namespace ferry::metrics
