#include "redis_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "redis_tls.h"

namespace ferry::protocol {
namespace {

std::string Where(const RedisEndpoint& ep) { return "redis " + ep.Address(); }

timeval ToTimeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

bool IsIpAddress(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

// ---- TCP --------------------------------------------------------------------------------------

// Each blocking read and write on fd bounded by timeout_ms (0: none). False with errno set.
bool SetTimeouts(int fd, int timeout_ms) {
  const timeval tv = ToTimeval(timeout_ms > 0 ? timeout_ms : 0);
  return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
         setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0;
}

// Blocking from now on, each read and write bounded by the timeout (hiredis's behaviour). False
// with errno set.
bool MakeBlocking(int fd, int timeout_ms) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0 && SetTimeouts(fd, timeout_ms);
}

Status ConnectTcp(const RedisEndpoint& ep, int timeout_ms, int* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &found);
  if (rc != 0) return Status::Unavailable(Where(ep) + ": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, freeaddrinfo);
  std::string why = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n;
        do n = poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
        while (n < 0 && errno == EINTR);
        socklen_t len = sizeof(err);
        if (n == 0)
          err = ETIMEDOUT;
        else if (n < 0)
          err = errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
    }
    if (err != 0) {
      why = err == ETIMEDOUT ? "connect timed out" : std::strerror(err);
      close(fd);
      continue;
    }
    const int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        !MakeBlocking(fd, timeout_ms)) {
      why = std::strerror(errno);
      close(fd);
      continue;
    }
    *out = fd;
    return Status::Ok();
  }
  return Status::Unavailable(Where(ep) + ": " + why);
}

// A Unix-domain socket connects at once or fails (ECONNREFUSED: nobody listens). When the
// listener's backlog is full (a stopped or stuck Redis) connect waits, bounded by the send
// timeout set before it, then fails with EAGAIN: unavailable, retried.
Status ConnectUnix(const RedisEndpoint& ep, int timeout_ms, int* out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (ep.unix_path.size() >= sizeof(addr.sun_path))
    return Status::Unavailable(Where(ep) + ": the socket path is too long");
  std::memcpy(addr.sun_path, ep.unix_path.data(), ep.unix_path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(Where(ep) + ": " + std::strerror(errno));
  if (!MakeBlocking(fd, timeout_ms) ||
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return Status::Unavailable(Where(ep) + ": " +
                               (err == EAGAIN ? "connect timed out" : std::strerror(err)));
  }
  *out = fd;
  return Status::Ok();
}

// hiredis's redisKeepAlive with its interval of 15 s: probes after 15 s idle, every 5 s, 3 of
// them.
void EnableKeepAlive(int fd) {
  int on = 1, idle = 15, interval = 5, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// `text` (an error reply to AUTH, say) with every occurrence of `secret` replaced by "***": a
// server or proxy that echoes its arguments must not put the password in a message or a log.
std::string Scrub(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at + 3))
    text.replace(at, secret.size(), "***");
  return text;
}

Status TransportFailure(const char* what, int error) {
  if (error == EAGAIN || error == EWOULDBLOCK)
    return Status::Unavailable(std::string("redis ") + what + " timed out");
  return Status::Unavailable(std::string("redis ") + what + ": " + std::strerror(error));
}

}  // namespace

// ---- RedisTransport ---------------------------------------------------------------------------

Status RedisTransport::Connect(const RedisEndpoint& endpoint, int timeout_ms, bool keepalive,
                               std::unique_ptr<RedisTransport>* out, bool* reached) {
  *reached = false;
  std::unique_ptr<RedisTransport> t(new RedisTransport());
  const bool unix_socket = !endpoint.unix_path.empty();
  FERRY_RETURN_IF_ERROR(unix_socket ? ConnectUnix(endpoint, timeout_ms, &t->fd_)
                                    : ConnectTcp(endpoint, timeout_ms, &t->fd_));
  *reached = true;
  t->socket_.fd = t->fd_;
  if (keepalive && !unix_socket) EnableKeepAlive(t->fd_);  // a local peer's end is always seen
  if (endpoint.tls) FERRY_RETURN_IF_ERROR(t->Handshake(endpoint));
  *out = std::move(t);
  return Status::Ok();
}

bool RedisTransport::SetTimeout(int timeout_ms) { return SetTimeouts(fd_, timeout_ms); }

RedisTransport::~RedisTransport() {
  if (ssl_) SSL_free(ssl_);  // frees our BIO; no close_notify: the socket just closes
  if (fd_ >= 0) close(fd_);
}

Status RedisTransport::Handshake(const RedisEndpoint& ep) {
  CtxPtr ctx;
  Status s = MakeTlsContext(ep, &ctx);
  if (!s.ok()) return Status::Unavailable(Where(ep) + ": " + s.message());
  ssl_ = SSL_new(ctx.get());  // holds its own reference to ctx
  BIO* bio = ssl_ ? BIO_new(SocketBioMethod()) : nullptr;
  if (!bio) return Status::Internal("TLS: " + SslErrors());
  BIO_set_data(bio, &socket_);
  SSL_set_bio(ssl_, bio, bio);
  // The name Redis's certificate must carry: a DNS name (also sent as SNI) or an IP address.
  const bool ip = IsIpAddress(ep.host);
  const bool named = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), ep.host.c_str()) == 1
                        : SSL_set_tlsext_host_name(ssl_, ep.host.c_str()) == 1 &&
                              SSL_set1_host(ssl_, ep.host.c_str()) == 1;
  if (!named) return Status::Internal("TLS: cannot set the expected host name: " + SslErrors());
  ERR_clear_error();
  const int rc = SSL_connect(ssl_);
  if (rc == 1) return Status::Ok();
  const int error = SSL_get_error(ssl_, rc);
  const long verify = SSL_get_verify_result(ssl_);
  const std::string where = Where(ep) + ": TLS handshake failed: ";
  if (verify != X509_V_OK) {
    ERR_clear_error();
    return Status::Unavailable(
        where + "the server's certificate did not verify (" +
        X509_verify_cert_error_string(verify) + ") against " +
        (ep.tls_ca.empty() ? "the system's CA certificates" : "--redis-tls-ca " + ep.tls_ca));
  }
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    ERR_clear_error();
    return Status::Unavailable(where + "timed out (is it a plain-TCP port? use redis://)");
  }
  if (socket_.eof) {
    ERR_clear_error();
    return Status::Unavailable(
        where +
        "Redis closed the connection (is it a TLS port? does it want a client "
        "certificate, --redis-tls-cert?)");
  }
  if (error == SSL_ERROR_SYSCALL && socket_.error != 0)
    return Status::Unavailable(where + std::strerror(socket_.error));
  return Status::Unavailable(where + SslErrors() + " (is it a TLS port? redis:// is plain TCP)");
}

Status RedisTransport::Write(const iovec* iov_in, size_t count) {
  if (ssl_) {
    // TLS cannot gather: small pieces are staged into records of up to 64 KiB, big ones
    // written from where they are.
    constexpr size_t kDirect = 16 * 1024, kStage = 64 * 1024;
    std::string staged;
    for (size_t i = 0; i < count; ++i) {
      const char* p = static_cast<const char*>(iov_in[i].iov_base);
      const size_t n = iov_in[i].iov_len;
      if (n >= kDirect) {
        if (!staged.empty()) FERRY_RETURN_IF_ERROR(SslWrite(staged.data(), staged.size()));
        staged.clear();
        FERRY_RETURN_IF_ERROR(SslWrite(p, n));
        continue;
      }
      staged.append(p, n);
      if (staged.size() >= kStage) {
        FERRY_RETURN_IF_ERROR(SslWrite(staged.data(), staged.size()));
        staged.clear();
      }
    }
    if (!staged.empty()) FERRY_RETURN_IF_ERROR(SslWrite(staged.data(), staged.size()));
    return Status::Ok();
  }
  std::vector<iovec> iov(iov_in, iov_in + count);
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return TransportFailure("write", errno);
    }
    size_t done = static_cast<size_t>(n);  // skip what went out
    while (first < iov.size() && done >= iov[first].iov_len) done -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return Status::Ok();
}

Status RedisTransport::SslWrite(const char* data, size_t n) {
  ERR_clear_error();
  socket_.error = 0;
  size_t written = 0;
  // Without SSL_MODE_ENABLE_PARTIAL_WRITE, success means all n bytes (OpenSSL itself resumes
  // after the short sends our BIO reports).
  const int rc = SSL_write_ex(ssl_, data, n, &written);
  if (rc == 1) return Status::Ok();
  const int error = SSL_get_error(ssl_, rc);
  if (error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ)
    return Status::Unavailable("redis write timed out");
  if (socket_.eof) return Status::Unavailable("redis closed the connection");
  if (error == SSL_ERROR_SYSCALL && socket_.error != 0)
    return TransportFailure("write", socket_.error);
  return Status::Unavailable("redis write: TLS: " + SslErrors());
}

Status RedisTransport::Read(char* buf, size_t n, size_t* got) {
  if (ssl_) return SslRead(buf, n, got);
  while (true) {
    const ssize_t r = recv(fd_, buf, n, 0);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return Status::Ok();
    }
    if (r == 0) return Status::Unavailable("redis closed the connection");
    if (errno == EINTR) continue;
    if (nonblocking_ && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *got = 0;
      return Status::Ok();
    }
    return TransportFailure("read", errno);
  }
}

Status RedisTransport::SslRead(char* buf, size_t n, size_t* got) {
  ERR_clear_error();
  socket_.error = 0;
  size_t r = 0;
  const int rc = SSL_read_ex(ssl_, buf, n, &r);
  if (rc == 1) {
    *got = r;
    return Status::Ok();
  }
  const int error = SSL_get_error(ssl_, rc);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    if (nonblocking_) {
      *got = 0;
      return Status::Ok();
    }
    return Status::Unavailable("redis read timed out");
  }
  if (error == SSL_ERROR_ZERO_RETURN || socket_.eof) {
    ERR_clear_error();
    return Status::Unavailable("redis closed the connection");
  }
  if (error == SSL_ERROR_SYSCALL && socket_.error != 0)
    return TransportFailure("read", socket_.error);
  return Status::Unavailable("redis read: TLS: " + SslErrors());
}

Status RedisTransport::SetNonBlocking() {
  const int flags = fcntl(fd_, F_GETFL);
  if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0)
    return Status::Unavailable(std::string("redis: fcntl: ") + std::strerror(errno));
  nonblocking_ = true;
  return Status::Ok();
}

Status RedisTransport::ReadNow(char* buf, size_t n, size_t* got) {
  *got = 0;
  return Read(buf, n, got);
}

// ---- RedisConnection --------------------------------------------------------------------------

void AppendRespCommand(std::string* out, const std::vector<std::string_view>& argv) {
  auto header = [out](char kind, size_t n) {
    char digits[24];
    auto end = std::to_chars(digits, digits + sizeof(digits), n).ptr;
    out->push_back(kind);
    out->append(digits, end);
    out->append("\r\n", 2);
  };
  header('*', argv.size());
  for (auto a : argv) {
    header('$', a.size());
    out->append(a.data(), a.size());
    out->append("\r\n", 2);
  }
}

RedisConnection::~RedisConnection() {
  if (reader_) redisReaderFree(reader_);
}

bool RedisConnection::buffered() const { return reader_->len > reader_->pos; }

Status RedisConnection::Feed(const char* data, size_t n) {
  if (redisReaderFeed(reader_, data, n) != REDIS_OK)
    return Status::Unavailable(std::string("redis: ") + reader_->errstr);
  return Status::Ok();
}

Status RedisConnection::ReadReply(redisReply** reply) {
  while (true) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_, &raw) != REDIS_OK)
      return Status::Unavailable(std::string("redis: protocol error: ") + reader_->errstr);
    if (raw != nullptr) {
      *reply = static_cast<redisReply*>(raw);
      return Status::Ok();
    }
    char buf[16 * 1024];  // hiredis's own read size
    size_t got = 0;
    FERRY_RETURN_IF_ERROR(transport_->Read(buf, sizeof(buf), &got));
    FERRY_RETURN_IF_ERROR(Feed(buf, got));
  }
}

Status RedisConnection::Open(const RedisEndpoint& ep, int timeout_ms, bool keepalive, bool select,
                             bool ping, std::unique_ptr<RedisConnection>* out, bool* refused) {
  bool turned_away = false;
  if (refused) *refused = false;
  std::unique_ptr<RedisConnection> c(new RedisConnection());
  bool reached = false;
  Status s = RedisTransport::Connect(ep, timeout_ms, keepalive, &c->transport_, &reached);
  if (!s.ok()) {
    if (refused) *refused = reached;  // TLS refused (TCP connected, the handshake failed)
    return s;
  }
  c->reader_ = redisReaderCreate();
  if (!c->reader_) return Status::Internal("redis: out of memory");
  enum class Step { kAuth, kSelect, kPing };
  std::vector<Step> steps;
  std::string hello;
  const std::string db = std::to_string(ep.db);
  if (!ep.password.empty()) {
    if (ep.user.empty())
      AppendRespCommand(&hello, {"AUTH", ep.password});
    else
      AppendRespCommand(&hello, {"AUTH", ep.user, ep.password});
    steps.push_back(Step::kAuth);
  }
  if (select && ep.db != 0) {
    AppendRespCommand(&hello, {"SELECT", db});
    steps.push_back(Step::kSelect);
  }
  if (ping) {
    AppendRespCommand(&hello, {"PING"});
    steps.push_back(Step::kPing);
  }
  // The first write or read failing: closed at once by a TLS peer that wants a client
  // certificate (TLS 1.3 says so only after the handshake: the write may meet a reset, the read
  // the alert), or by a TLS port a plain client talks to. A timeout is not a refusal.
  auto closed = [&](const Status& failure) {
    turned_away = failure.message().find("timed out") == std::string::npos;
    std::string hint;  // none for a Unix-domain socket: no TLS there
    if (ep.unix_path.empty() && !ep.tls)
      hint = " (is it a TLS port? use rediss://)";
    else if (ep.unix_path.empty() && ep.tls_cert.empty())
      hint = " (does Redis want a client certificate? --redis-tls-cert, --redis-tls-key)";
    return Status::Unavailable(Where(ep) + ": " + failure.message() + hint);
  };
  if (!steps.empty()) {
    const iovec iov{hello.data(), hello.size()};
    s = c->transport_->Write(&iov, 1);
    OPENSSL_cleanse(hello.data(), hello.size());  // the password
    if (!s.ok()) s = closed(s);
    for (size_t i = 0; s.ok() && i < steps.size(); ++i) {
      redisReply* r = nullptr;
      s = c->ReadReply(&r);
      if (!s.ok()) {
        s = closed(s);
        break;
      }
      std::unique_ptr<redisReply, void (*)(void*)> owned(r, freeReplyObject);
      if (r->type != REDIS_REPLY_ERROR) continue;
      const std::string error = Scrub(std::string(r->str, r->len), ep.password);
      switch (steps[i]) {
        case Step::kAuth:
          s = Status::Unavailable(Where(ep) + " refused the credentials of user \"" +
                                  ep.UserName() + "\": " + error);
          turned_away = true;
          break;
        case Step::kSelect:
          s = Status::Unavailable(Where(ep) + " refused SELECT " + db + ": " + error);
          turned_away = true;
          break;
        case Step::kPing:
          // LOADING, BUSY and the like pass: Redis is there and will serve soon.
          if (error.rfind("NOAUTH", 0) == 0 || error.rfind("WRONGPASS", 0) == 0) {
            s = Status::Unavailable(Where(ep) + " wants a password (" + error +
                                    "): give it in the URL or with --redis-password-file");
            turned_away = true;
          }
          break;
      }
    }
  }
  if (!s.ok()) {
    if (refused) *refused = turned_away;
    return s;
  }
  *out = std::move(c);
  return Status::Ok();
}

}  // namespace ferry::protocol
