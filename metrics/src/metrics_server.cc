// A small HTTP/1.x server for four GET paths: one thread owns the listening socket and every
// connection, and waits on them with poll(2).
//
// Why not cpp-httplib's server (used before; http_get.cc still uses its client): Debian's build
// of it reads request bodies and header lines without bound, and each of its handler threads
// waits on one client with a timeout per read, not per request. One POST with a big
// Content-Length grew a broker by 1.7 GB in 8 s; two clients sending a header line every few
// seconds held both threads, and /livez stopped answering (a liveness probe then restarts a
// healthy broker). Here:
//   - a connection has 5 s for its whole exchange (request head in, response out), then closes;
//   - a request head is at most 16 KiB (else 431); no body is ever read;
//   - at most 64 connections are open (the listening socket waits in the backlog meanwhile);
//   - every answer closes its connection (Connection: close): a scrape every few seconds does
//     not need keep-alive, and nothing of a client outlives its answer.
// The handlers run on this thread; they are quick (a render of the registry, atomic reads).
#include "ferry/metrics/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/metrics/registry.h"

namespace ferry::metrics {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxHeadBytes = 16 * 1024;
constexpr size_t kMaxConnections = 64;
constexpr auto kExchangeTimeout = std::chrono::seconds(5);

struct Connection {
  int fd = -1;
  std::string in;   // the request head so far
  std::string out;  // the response; empty until the head is complete
  size_t sent = 0;
  Clock::time_point deadline;
};

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body, bool head_only) {
  std::string r =
      "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + content_type +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (code == 405) r += "Allow: GET, HEAD\r\n";
  r += "\r\n";
  if (!head_only) r += body;
  return r;
}

std::string Plain(int code, const char* reason, const std::string& body, bool head_only = false) {
  return Response(code, reason, "text/plain", body, head_only);
}

// The end of the request head ("\r\n\r\n", or "\n\n" from a lax client), or npos.
size_t HeadEnd(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n"), lf = in.find("\n\n");
  return std::min(crlf == std::string::npos ? crlf : crlf + 4,
                  lf == std::string::npos ? lf : lf + 2);
}

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

}  // namespace

class MetricsServer::Impl {
 public:
  const Registry* registry = nullptr;
  MetricsServerOptions options;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // Stop writes a byte to wake[1]
  std::thread thread;

  ~Impl() {
    CloseFd(&listen_fd);
    CloseFd(&wake[0]);
    CloseFd(&wake[1]);
  }
  Status Bind(int port, int* bound);
  void Loop();
  std::string Answer(const std::string& head);
  std::string Check(int level, bool head_only);
};

Status MetricsServer::Impl::Bind(int port, int* bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port == kAnyPort ? 0 : port);
  const std::string where = options.bind_address + ":" + (port == kAnyPort ? "0" : service);
  if (int rc = getaddrinfo(options.bind_address.c_str(), service.c_str(), &hints, &found); rc != 0)
    return Status::Unavailable("metrics: cannot bind " + where + ": " + gai_strerror(rc));
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: SO_REUSEPORT would let a second process (two workers given the same
    // --metrics-port) bind the port too and split the scrapes.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      listen_fd = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd < 0) return Status::Unavailable("metrics: cannot bind " + where + ": " + error);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return Status::Internal("metrics: cannot read the bound port");
  *bound = std::atoi(serv);
  return Status::Ok();
}

std::string MetricsServer::Impl::Check(int level, bool head_only) {
  enum Level { kLive, kHealthy, kReady };
  std::string why;
  const bool ok = (!options.health || options.health(&why)) &&
                  (level < kHealthy || !options.depends || options.depends(&why)) &&
                  (level < kReady || !options.ready || options.ready(&why));
  if (!ok)
    return Plain(503, "Service Unavailable", why.empty() ? "unhealthy\n" : why + "\n", head_only);
  return Plain(200, "OK", "ok\n", head_only);
}

std::string MetricsServer::Impl::Answer(const std::string& head) {
  // The request line: METHOD SP TARGET SP HTTP/1.x. The headers are not needed.
  const std::string_view line(head.data(), head.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0)
    return Plain(400, "Bad Request", "bad request\n");
  const std::string_view method = line.substr(0, sp1);
  std::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) return Plain(405, "Method Not Allowed", "GET or HEAD\n");
  try {
    if (path == "/metrics") {
      if (options.before_scrape) options.before_scrape();
      return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry->Expose(),
                      head_only);
    }
    if (path == "/livez") return Check(0, head_only);
    if (path == "/healthz") return Check(1, head_only);
    if (path == "/readyz") return Check(2, head_only);
  } catch (const std::exception& e) {
    return Plain(500, "Internal Server Error", std::string(e.what()) + "\n", head_only);
  }
  return Plain(404, "Not Found", "not found\n", head_only);
}

void MetricsServer::Impl::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, static_cast<short>(conns.size() < kMaxConnections ? POLLIN : 0), 0});
    Clock::time_point next = Clock::time_point::max();
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (!conns.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 60000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;  // (EINTR; anything else: the probes must not stop for good)
    }
    if (fds[0].revents != 0) break;  // Stop
    const auto now = Clock::now();
    const size_t polled = conns.size();
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = conns[i];
      const short events = fds[2 + i].revents;
      bool done = now >= c.deadline;
      if (!done && c.out.empty() && events != 0) {
        char buf[4096];
        for (;;) {
          const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            done = true;  // closed (or failed) before its request was whole
            break;
          }
          if (n < 0) break;  // read all there is
          c.in.append(buf, static_cast<size_t>(n));
          if (const size_t end = HeadEnd(c.in); end != std::string::npos) {
            c.out = Answer(c.in.substr(0, end));
            break;
          }
          if (c.in.size() > kMaxHeadBytes) {
            c.out = Plain(431, "Request Header Fields Too Large", "request head over 16 KiB\n");
            break;
          }
        }
        if (!c.out.empty()) {  // answered: the head is not needed any more
          c.in.clear();
          c.in.shrink_to_fit();
        }
      }
      if (!done && !c.out.empty()) {  // send what the socket takes now; POLLOUT for the rest
        while (c.sent < c.out.size()) {
          const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (n < 0) {
            if (errno != EAGAIN && errno != EINTR) done = true;
            break;
          }
          c.sent += static_cast<size_t>(n);
        }
        if (c.sent == c.out.size()) done = true;
      }
      if (done) CloseFd(&c.fd);
    }
    conns.erase(
        std::remove_if(conns.begin(), conns.end(), [](const Connection& c) { return c.fd < 0; }),
        conns.end());
    if (fds[1].revents & POLLIN) {
      while (conns.size() < kMaxConnections) {
        const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          // Out of descriptors: the listener stays readable, and polling it again at once
          // would spin. Wait a little (the pending connections wait in the backlog).
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          break;  // none left (EAGAIN), or one that failed
        }
        Connection c;
        c.fd = fd;
        c.deadline = now + kExchangeTimeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (Connection& c : conns) CloseFd(&c.fd);
}

Status MetricsServer::Start(const Registry* registry, const MetricsServerOptions& options,
                            std::unique_ptr<MetricsServer>* out) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  if (options.port == 0) {  // disabled
    *out = std::move(s);
    return Status::Ok();
  }
  if (options.port < kAnyPort || options.port > 65535)
    return Status::InvalidArgument("metrics port out of range: " + std::to_string(options.port));
  auto impl = std::make_unique<Impl>();
  impl->registry = registry;
  impl->options = options;
  int port = 0;
  FERRY_RETURN_IF_ERROR(impl->Bind(options.port, &port));
  if (pipe2(impl->wake, O_CLOEXEC) != 0)
    return Status::Internal(std::string("metrics: pipe: ") + std::strerror(errno));
  // Connections queue in the listening socket's backlog until the loop takes them: Start may
  // return before the thread runs.
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  s->impl_ = std::move(impl);
  s->port_ = port;
  *out = std::move(s);
  return Status::Ok();
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (!impl_) return;
  const char byte = 1;
  (void)!write(impl_->wake[1], &byte, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_.reset();
  port_ = 0;
}

}  // namespace ferry::metrics
