#pragma once
// Where Redis is and how to get in: host, port, database, ACL user and password, TLS files.
// Every component takes the same URL and flags (docs/operations.md, docs/security.md):
//
//   redis://[USER[:PASSWORD]@]HOST:PORT[/DB]     plain TCP
//   rediss://[USER[:PASSWORD]@]HOST:PORT[/DB]    TLS (OpenSSL), the server's certificate verified
//   unix://[USER[:PASSWORD]@]/PATH[?db=DB]        a Unix-domain socket, for members on Redis's
//                                                 host (redis-py's and go-redis's form)
//   --redis-password-file FILE   the password, kept out of argv and `ps`
//   --redis-tls-ca FILE          CA certificates (PEM) that verify Redis's certificate
//   --redis-tls-cert FILE        a client certificate (PEM), for Redis's tls-auth-clients
//   --redis-tls-key FILE         its private key (PEM, unencrypted)
//
// A password never appears in a Status message or a log line made here: RedactRedisUrl and
// RedisEndpoint::Describe stand in "***" for it.

#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::protocol {

struct RedisEndpoint {
  std::string host = "127.0.0.1";  // a name, an IPv4 or an IPv6 address (no brackets)
  int port = 6379;
  // unix://: the socket's path (absolute); host and port are then unused.
  std::string unix_path;
  int db = 0;
  // With a password, every connection (and reconnection) starts with `AUTH USER PASSWORD`, or
  // `AUTH PASSWORD` (Redis's "default" user) when `user` is empty.
  std::string user;
  std::string password;
  // rediss://: TLS 1.2 or later; the server's certificate must chain to `tls_ca` (the system's
  // CAs when empty) and name `host` (DNS name or IP address in its subjectAltName).
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;  // with tls_key: presented to Redis when it asks for a client certificate
  std::string tls_key;

  // "rediss://USER:***@HOST:PORT/DB" (or "unix://USER:***@/PATH?db=DB"): for logs and
  // messages; never the password.
  std::string Describe() const;
  // Where it connects, for messages: "HOST:PORT", "[V6]:PORT" or "unix:/PATH".
  std::string Address() const;
  // The ACL user AUTH names: `user`, or "default".
  std::string UserName() const { return user.empty() ? "default" : user; }
};

// Parses a Redis URL (above; also a bare HOST:PORT). An IPv6 address goes in brackets:
// redis://[::1]:6379. USER and PASSWORD may be percent-encoded (%40 for '@'). A unix:// URL
// takes one query parameter, db. Fails with invalid_argument, naming what is wrong, the URL
// redacted.
Status ParseRedisUrl(std::string_view url, RedisEndpoint* out);

// What the URL leaves out: the files named by --redis-password-file and --redis-tls-*.
struct RedisAccessFiles {
  std::string password_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

// ParseRedisUrl, then the files: reads the password (one line; a trailing newline is dropped),
// and checks that the TLS files load (a CA that is not PEM, a key that does not match its
// certificate) -- so that a process fails at start, not at its first connection. Fails with
// invalid_argument when a file cannot be read or is wrong, when the password is given both in
// the URL and in a file, when the URL names a user but no password is given, or when TLS files
// come with a redis:// URL.
Status ResolveRedisEndpoint(std::string_view url, const RedisAccessFiles& files,
                            RedisEndpoint* out);

// `url` with its password (if any) replaced by "***"; works on URLs that do not parse too.
std::string RedactRedisUrl(std::string_view url);
// `url` without its password (redis://user@host:port); the password, decoded, in *password
// ("" when there was none).
std::string StripRedisPassword(std::string_view url, std::string* password);

}  // namespace ferry::protocol
