// MetricsServer scraped over a real TCP socket (plain POSIX, not the library's own client), plus
// HttpGet, /livez, /healthz, /readyz, errors and clean start/stop; the process_* metrics and
// the Redis probe (against a real redis-server).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/redis_probe.h"
#include "ferry/metrics/registry.h"
#include "ferry/metrics/text_format.h"
#include "process.h"

namespace ferry::metrics {
namespace {

// A connected TCP socket to 127.0.0.1:port, with receive and send timeouts; -1 on failure.
int Connect(int port, int timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends a raw HTTP/1.0 request to 127.0.0.1:port and returns the whole response.
std::string RawRequest(int port, const std::string& request) {
  const int fd = Connect(port, 30);
  if (fd < 0) return "";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// Sends `first`, then `chunk` again and again, up to `limit` bytes in all, until a send fails.
// Returns the bytes sent; *closed says the server closed the connection (EPIPE, ECONNRESET), as
// opposed to a send that timed out or a limit reached.
size_t SendUntilClosed(int fd, const std::string& first, const std::string& chunk, size_t limit,
                       bool* closed) {
  *closed = false;
  size_t sent = 0;
  const std::string* what = &first;
  while (sent < limit) {
    const ssize_t n = send(fd, what->data(), what->size(), MSG_NOSIGNAL);
    if (n < 0) {
      *closed = errno == EPIPE || errno == ECONNRESET;
      break;
    }
    sent += static_cast<size_t>(n);
    what = &chunk;
  }
  return sent;
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

// /livez asks only `health`; /healthz also `depends` (Redis); /readyz also `ready`. Each 503
// carries the reason of the check that failed.
TEST(MetricsServer, LivezHealthzReadyzLayers) {
  Registry r;
  std::atomic<bool> live{true}, deps{true}, ready{true};
  MetricsServerOptions o;
  o.health = [&](std::string* why) {
    if (!live) *why = "event loop stalled";
    return live.load();
  };
  o.depends = [&](std::string* why) {
    if (!deps) *why = "redis 127.0.0.1:1 unreachable";
    return deps.load();
  };
  o.ready = [&](std::string* why) {
    if (!ready) *why = "broker not heard from yet";
    return ready.load();
  };
  auto server = StartOrDie(&r, o);
  auto get = [&](const char* path) {
    return RawRequest(server->port(), std::string("GET ") + path + " HTTP/1.0\r\n\r\n");
  };
  for (const char* path : {"/livez", "/healthz", "/readyz"}) {
    EXPECT_EQ(get(path).rfind("HTTP/1.1 200", 0), 0u) << path;
  }
  ready = false;
  EXPECT_EQ(get("/livez").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(get("/healthz").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(get("/readyz").rfind("HTTP/1.1 503", 0), 0u);
  EXPECT_EQ(Body(get("/readyz")), "broker not heard from yet\n");
  deps = false;
  EXPECT_EQ(get("/livez").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(get("/healthz").rfind("HTTP/1.1 503", 0), 0u);
  EXPECT_EQ(Body(get("/healthz")), "redis 127.0.0.1:1 unreachable\n");
  EXPECT_EQ(Body(get("/readyz")), "redis 127.0.0.1:1 unreachable\n");
  live = false;
  EXPECT_EQ(get("/livez").rfind("HTTP/1.1 503", 0), 0u);
  EXPECT_EQ(Body(get("/livez")), "event loop stalled\n");
}

// Slow clients do not hold the probes: four connections trickle a header byte every 300 ms
// (each read succeeds, so a per-read timeout never fires) while /livez is asked. Before, two
// such clients held cpp-httplib's two handler threads and /livez did not answer at all. The
// server closes them once their 5 s for a request have passed.
TEST(MetricsServer, SlowClientsDoNotHoldTheProbes) {
  Registry r;
  auto server = StartOrDie(&r);
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    slow.push_back(Connect(server->port(), 30));
    ASSERT_GE(slow.back(), 0);
    const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    send(slow.back(), head.data(), head.size(), MSG_NOSIGNAL);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      for (int fd : slow) send(fd, "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  const int probe = Connect(server->port(), 10);
  ASSERT_GE(probe, 0);
  const std::string livez = "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
  send(probe, livez.data(), livez.size(), MSG_NOSIGNAL);
  char buf[256];
  const ssize_t n = recv(probe, buf, sizeof(buf), 0);
  close(probe);
  stop = true;
  trickle.join();
  ASSERT_GT(n, 0) << "no answer to /livez while slow clients were connected";
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 200", 0), 0u);
  for (int fd : slow) {  // closed by the server: recv gives 0 (or a reset), not the timeout
    ssize_t got;
    while ((got = recv(fd, buf, sizeof(buf), 0)) > 0) {
    }
    EXPECT_TRUE(got == 0 || errno == ECONNRESET) << "a slow client kept its connection";
    close(fd);
  }
}

// A client cannot make the server read without end: an endless request head stops at 16 KiB
// (431), and a body is never read (a POST: 405). In both the server closes the connection long
// before 64 MiB went out. Before, cpp-httplib read header lines and bodies without bound (a
// broker grew by 1.7 GB in 8 s).
TEST(MetricsServer, EndlessHeadersAndBodiesAreNotRead) {
  Registry r;
  auto server = StartOrDie(&r);
  constexpr size_t kLimit = size_t{64} << 20;
  const std::string header_line = "X-Flood: " + std::string(1000, 'a') + "\r\n";
  struct Case {
    std::string first, chunk;
  };
  const std::vector<Case> cases = {
      {"GET /metrics HTTP/1.1\r\n", header_line},
      {"POST /metrics HTTP/1.1\r\nContent-Length: 100000000000\r\n\r\n", std::string(65536, 'b')},
  };
  for (const Case& c : cases) {
    const int fd = Connect(server->port(), 20);
    ASSERT_GE(fd, 0);
    bool closed = false;
    const size_t sent = SendUntilClosed(fd, c.first, c.chunk, kLimit, &closed);
    close(fd);
    EXPECT_TRUE(closed) << c.first << ": sent " << sent << " bytes and the server read on";
    EXPECT_LT(sent, kLimit) << c.first;
  }
  // The first line of each answer, had the client read it before writing on.
  EXPECT_EQ(RawRequest(server->port(), "GET /metrics HTTP/1.1\r\n" + std::string(20000, 'h'))
                .rfind("HTTP/1.1 431", 0),
            0u);
  EXPECT_EQ(RawRequest(server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
                .rfind("HTTP/1.1 405", 0),
            0u);
  const std::string head = RawRequest(server->port(), "HEAD /livez HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(Body(head), "") << "HEAD answered with a body";
  EXPECT_EQ(RawRequest(server->port(), "GET /livez HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

// A request head that comes in several pieces is read whole: answered once it ends, and 431
// once it passes 16 KiB however it is cut.
TEST(MetricsServer, AHeadInPiecesIsReadWhole) {
  Registry r;
  auto server = StartOrDie(&r);
  auto in_pieces = [&](const std::vector<std::string>& pieces) {
    const int fd = Connect(server->port(), 20);
    EXPECT_GE(fd, 0);
    char buf[4096];
    for (const auto& p : pieces) {
      if (recv(fd, buf, 1, MSG_PEEK | MSG_DONTWAIT) > 0) break;  // answered: send no more
      send(fd, p.data(), p.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // one read each
    }
    std::string out;
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    close(fd);
    return out;
  };
  const std::string livez = in_pieces({"GET /li", "vez HTTP/1.1\r\n", "Host: x\r\n", "\r\n"});
  EXPECT_EQ(livez.rfind("HTTP/1.1 200", 0), 0u) << livez;
  EXPECT_EQ(Body(livez), "ok\n");
  std::vector<std::string> big = {"GET /metrics HTTP/1.1\r\n"};
  for (int i = 0; i < 20; ++i) big.push_back("X-Big: " + std::string(1000, 'a') + "\r\n");
  const std::string refused = in_pieces(big);
  EXPECT_EQ(refused.rfind("HTTP/1.1 431", 0), 0u) << refused.substr(0, 100);
}

// The process_* series of every Prometheus client library, read from /proc/self.
TEST(ProcessMetrics, SampledFromProc) {
  Registry r;
  names::SampleProcessMetrics(&r);
  volatile double x = 0;  // burn a little CPU: the counter must not go down, and may go up
  for (int i = 0; i < 20000000; ++i) x = x + 1.0;
  names::SampleProcessMetrics(&r);
  ParsedText parsed;
  ASSERT_TRUE(ParseText(r.Expose(), &parsed).ok());
  EXPECT_GT(SumSamples(parsed, names::kProcessRss), 1e6);    // a test binary: megabytes
  EXPECT_GE(SumSamples(parsed, names::kProcessOpenFds), 3);  // stdin, stdout, stderr
  EXPECT_GE(SumSamples(parsed, names::kProcessMaxFds), SumSamples(parsed, names::kProcessOpenFds));
  EXPECT_GT(SumSamples(parsed, names::kProcessCpu), 0);
  EXPECT_NE(r.Expose().find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
}

// ferry_redis_up and the memory gauges against a real redis-server, then with it stopped.
TEST(RedisProbe, UpMemoryThenDownWithTheReason) {
  testutil::RedisServer redis;
  Registry r;
  RedisProbe::Options o;
  o.endpoint = redis.endpoint();
  o.interval_ms = 50;
  o.timeout_ms = 500;
  o.memory = true;
  RedisProbe probe(&r, o);
  std::string why;
  ASSERT_TRUE(testutil::WaitFor([&] { return probe.Up(&why); })) << why;
  ParsedText parsed;
  ASSERT_TRUE(testutil::WaitFor([&] {
    parsed = ParsedText();
    return ParseText(r.Expose(), &parsed).ok() && SumSamples(parsed, names::kRedisUsedMemory) > 0;
  }));
  EXPECT_EQ(SumSamples(parsed, names::kRedisUp), 1);
  EXPECT_GE(SumSamples(parsed, names::kRedisMaxMemory), 0);

  // At its maxmemory with noeviction Redis answers but refuses writes: not up for /readyz
  // (before, it was, while every SUBMIT was rejected), though the gauge says it answers.
  auto admin = redis.Connect();
  ASSERT_NE(admin, nullptr);
  protocol::RedisReply reply;
  ASSERT_TRUE(admin->Command({"CONFIG", "SET", "maxmemory", "1"}, &reply).ok());
  ASSERT_TRUE(testutil::WaitFor([&] { return !probe.Up(&why); }));
  EXPECT_NE(why.find("maxmemory with noeviction"), std::string::npos) << why;
  ASSERT_TRUE(admin->Command({"CONFIG", "SET", "maxmemory", "0"}, &reply).ok());
  ASSERT_TRUE(testutil::WaitFor([&] { return probe.Up(&why); })) << why;

  redis.Stop();
  ASSERT_TRUE(testutil::WaitFor([&] { return !probe.Up(&why); }));
  EXPECT_NE(why.find("unreachable"), std::string::npos) << why;
  EXPECT_NE(why.find(std::to_string(redis.port())), std::string::npos) << why;
  parsed = ParsedText();
  ASSERT_TRUE(ParseText(r.Expose(), &parsed).ok());
  EXPECT_EQ(SumSamples(parsed, names::kRedisUp), 0);

  redis.Restart();
  EXPECT_TRUE(testutil::WaitFor([&] { return probe.Up(&why); })) << why;
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
