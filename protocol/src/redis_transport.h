#pragma once
// The byte stream under RedisClient and RedisSubscriber. Debian bookworm's hiredis (0.14) has no
// TLS, so Ferry owns the socket -- TCP, TLS through OpenSSL for rediss://, or a Unix-domain
// socket for unix:// -- and uses hiredis only to parse replies (redisReader); the TLS pieces (the
// BIO, the context) are in redis_tls.h. Internal to ferry::protocol.
//
// RedisTransport: one connected socket, plain or TLS, with the timeouts of hiredis's blocking
// mode (connect, each read, each write). Writes never raise SIGPIPE (MSG_NOSIGNAL, also under
// TLS: OpenSSL writes through a BIO of ours).
// RedisConnection: a transport plus a reply parser, authenticated (AUTH) and on its database
// (SELECT) before anyone uses it.
//
// Thread-safety: none; one thread at a time.

#include <sys/uio.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"

struct ssl_st;
struct redisReader;
struct redisReply;

namespace ferry::protocol {

class RedisTransport {
 public:
  // Connects to every address of endpoint.host in turn within timeout_ms (or to the Unix-domain
  // socket endpoint.unix_path), then (endpoint.tls)
  // does the TLS handshake: the server's certificate verified against tls_ca and host, the
  // client certificate presented when given. `keepalive`: TCP keepalive probes, for a connection
  // that only reads. *reached: TCP connected (a failure after that is Redis, or a TLS peer,
  // turning this client away, not Redis being down). Failures are `unavailable`.
  static Status Connect(const RedisEndpoint& endpoint, int timeout_ms, bool keepalive,
                        std::unique_ptr<RedisTransport>* out, bool* reached);
  ~RedisTransport();
  RedisTransport(const RedisTransport&) = delete;
  RedisTransport& operator=(const RedisTransport&) = delete;

  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // Bounds each later blocking read and write by timeout_ms (0: none), as Connect did with its
  // own. False when the system refuses.
  bool SetTimeout(int timeout_ms);
  // Every byte of iov[0..count), in order (a gather write on plain TCP). Blocking.
  Status Write(const iovec* iov, size_t count);
  // Blocking: at least one byte (at most n) into buf, or a failure (closed, timed out, error).
  Status Read(char* buf, size_t n, size_t* got);
  // From now on reads never block: ReadNow sets *got = 0 when nothing is there now. With TLS,
  // call it until it reads nothing: what OpenSSL holds decrypted is invisible to poll().
  Status SetNonBlocking();
  Status ReadNow(char* buf, size_t n, size_t* got);

  // What our BIO saw on the socket (for error messages).
  struct SocketState {
    int fd = -1;
    int error = 0;     // the last errno of a failed send/recv
    bool eof = false;  // recv returned 0
  };

 private:
  RedisTransport() = default;
  Status Handshake(const RedisEndpoint& endpoint);
  Status SslRead(char* buf, size_t n, size_t* got);
  Status SslWrite(const char* data, size_t n);

  int fd_ = -1;
  bool nonblocking_ = false;
  ssl_st* ssl_ = nullptr;
  SocketState socket_;
};

// Builds the TLS context of `endpoint` once and throws it away: a CA file that holds no
// certificate, an unreadable file or a key that does not match its certificate fail here
// (invalid_argument), at start, instead of at each connection.
Status CheckTlsFiles(const RedisEndpoint& endpoint);

class RedisConnection {
 public:
  // RedisTransport::Connect, then in one round trip AUTH (with a password), SELECT (`select`
  // and a database other than 0) and PING (`ping`: a Redis that wants a password none was given
  // for answers NOAUTH now). *refused (optional): the failure is Redis turning this client away
  // -- TLS, credentials, database, NOAUTH -- which no retry cures; false when Redis could not be
  // reached or did not answer in time.
  static Status Open(const RedisEndpoint& endpoint, int timeout_ms, bool keepalive, bool select,
                     bool ping, std::unique_ptr<RedisConnection>* out, bool* refused = nullptr);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  RedisTransport& transport() { return *transport_; }
  redisReader* reader() { return reader_; }
  // Whether the parser holds bytes not yet made into replies.
  bool buffered() const;
  // The next reply, reading (blocking) as needed; free it with freeReplyObject. A reply Redis
  // did not send by the protocol (the stream is out of step) is `unavailable` too.
  Status ReadReply(redisReply** reply);
  // Hands bytes read elsewhere to the parser.
  Status Feed(const char* data, size_t n);

 private:
  RedisConnection() = default;
  std::unique_ptr<RedisTransport> transport_;
  redisReader* reader_ = nullptr;
};

// The RESP form of one command, appended to *out.
void AppendRespCommand(std::string* out, const std::vector<std::string_view>& argv);

}  // namespace ferry::protocol
