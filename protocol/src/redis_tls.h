#pragma once
// TLS pieces of the Redis transport (redis_tls.cc), internal to ferry::protocol. OpenSSL 3.

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"
#include "redis_transport.h"

namespace ferry::protocol {

// OpenSSL's queued errors as "reason; reason", the queue emptied.
std::string SslErrors();

// A BIO over the socket of a RedisTransport::SocketState (BIO_set_data): send with MSG_NOSIGNAL,
// so a peer that closed never raises SIGPIPE, also under TLS; it records the last errno and EOF
// there for error messages. One method for the process, made on first use.
BIO_METHOD* SocketBioMethod();

struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;

// The client context of `ep`: TLS 1.2 or later, the server verified against ep.tls_ca (the
// system's CAs without one), ep.tls_cert and ep.tls_key presented when given. A file that does
// not load or a key that does not match is invalid_argument, with the flag's name.
Status MakeTlsContext(const RedisEndpoint& ep, CtxPtr* out);

}  // namespace ferry::protocol
