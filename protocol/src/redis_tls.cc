// TLS for Redis connections (rediss://): OpenSSL's error queue as text, a socket BIO that never
// raises SIGPIPE, and the client context built from the endpoint's files. RedisTransport
// (redis_transport.cc) does the handshake and the reads and writes with them.
#include "redis_tls.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>

namespace ferry::protocol {
namespace {

// ---- a socket BIO that never raises SIGPIPE ---------------------------------------------------

int BioWrite(BIO* b, const char* data, size_t n, size_t* written) {
  auto* s = static_cast<RedisTransport::SocketState*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  while (true) {
    const ssize_t r = send(s->fd, data, n, MSG_NOSIGNAL);
    if (r >= 0) {
      *written = static_cast<size_t>(r);
      return 1;
    }
    if (errno == EINTR) continue;
    s->error = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return 0;
  }
}

int BioRead(BIO* b, char* out, size_t n, size_t* got) {
  auto* s = static_cast<RedisTransport::SocketState*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  while (true) {
    const ssize_t r = recv(s->fd, out, n, 0);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return 1;
    }
    if (r == 0) {
      s->eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    s->error = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return 0;
  }
}

long BioCtrl(BIO* b, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_EOF:
      return static_cast<RedisTransport::SocketState*>(BIO_get_data(b))->eof ? 1 : 0;
    default:
      return 0;
  }
}

// Never prompts for a key's passphrase on the terminal: an encrypted key fails to load.
int NoPassphrase(char*, int, int, void*) { return 0; }

}  // namespace

// OpenSSL's queued errors as "reason; reason", the queue emptied.
std::string SslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    char buf[256];
    if (!reason) {
      ERR_error_string_n(e, buf, sizeof(buf));
      reason = buf;
    }
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out.empty() ? "unknown TLS error" : out;
}

BIO_METHOD* SocketBioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "ferry redis socket");
    BIO_meth_set_write_ex(m, BioWrite);
    BIO_meth_set_read_ex(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

Status MakeTlsContext(const RedisEndpoint& ep, CtxPtr* out) {
  ERR_clear_error();
  CtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return Status::Internal("TLS: " + SslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_default_passwd_cb(ctx.get(), NoPassphrase);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // Read whole socket buffers, not a record header then its body (two recv() per record);
  // what this reads ahead is invisible to poll(): RedisSubscriber reads until OpenSSL is empty.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  if (ep.tls_ca.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1)
      return Status::InvalidArgument("TLS: cannot load the system's CA certificates: " +
                                     SslErrors());
  } else if (SSL_CTX_load_verify_locations(ctx.get(), ep.tls_ca.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("--redis-tls-ca " + ep.tls_ca + ": " + SslErrors());
  }
  if (!ep.tls_cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), ep.tls_cert.c_str()) != 1)
      return Status::InvalidArgument("--redis-tls-cert " + ep.tls_cert + ": " + SslErrors());
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), ep.tls_key.c_str(), SSL_FILETYPE_PEM) != 1) {
      const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
      const std::string why = SslErrors();
      if (mismatch)
        return Status::InvalidArgument("--redis-tls-key " + ep.tls_key +
                                       " does not match --redis-tls-cert " + ep.tls_cert);
      return Status::InvalidArgument("--redis-tls-key " + ep.tls_key + ": " + why);
    }
    if (SSL_CTX_check_private_key(ctx.get()) != 1)
      return Status::InvalidArgument("--redis-tls-key " + ep.tls_key +
                                     " does not match --redis-tls-cert " + ep.tls_cert);
  }
  *out = std::move(ctx);
  return Status::Ok();
}

Status CheckTlsFiles(const RedisEndpoint& endpoint) {
  CtxPtr ctx;
  return MakeTlsContext(endpoint, &ctx);
}

}  // namespace ferry::protocol
