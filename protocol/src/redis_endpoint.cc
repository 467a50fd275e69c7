#include "ferry/protocol/redis_endpoint.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "redis_transport.h"

namespace ferry::protocol {
namespace {

constexpr std::string_view kPlain = "redis://";
constexpr std::string_view kTls = "rediss://";
constexpr std::string_view kUnix = "unix://";
// sockaddr_un's sun_path holds 108 bytes with the terminating NUL.
constexpr size_t kMaxUnixPath = 107;

// Where the part after the scheme starts (0 without a scheme).
size_t AfterScheme(std::string_view url) {
  const size_t sep = url.find("://");
  return sep == std::string_view::npos ? 0 : sep + 3;
}

// Where the user part may end: the whole URL, but for unix:// the first '/' after the scheme
// (its path starts there; a '/' in the password is written %2F, as Python's urlsplit wants).
size_t UserPartLimit(std::string_view url) {
  if (url.substr(0, kUnix.size()) != kUnix) return url.size();
  const size_t slash = url.find('/', kUnix.size());
  return slash == std::string_view::npos ? url.size() : slash;
}

// [begin, end) of the password in `url` (begin == end: none).
std::pair<size_t, size_t> PasswordSpan(std::string_view url) {
  const size_t start = AfterScheme(url);
  const size_t limit = UserPartLimit(url);
  const size_t at = limit == 0 ? std::string_view::npos : url.rfind('@', limit - 1);
  if (at == std::string_view::npos || at < start) return {0, 0};
  const size_t colon = url.find(':', start);
  if (colon == std::string_view::npos || colon > at) return {0, 0};
  return {colon + 1, at};
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

bool ParseInt(std::string_view text, int min, int max, int* out) {
  if (text.empty()) return false;
  int v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < min || v > max) return false;
  *out = v;
  return true;
}

Status ReadPasswordFile(const std::string& path, std::string* password) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::InvalidArgument("--redis-password-file " + path +
                                   ": cannot read it: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) return Status::InvalidArgument("--redis-password-file " + path + " is empty");
  if (text.find('\n') != std::string::npos)
    return Status::InvalidArgument("--redis-password-file " + path +
                                   " has more than one line; it holds the password alone");
  *password = std::move(text);
  return Status::Ok();
}

}  // namespace

std::string RedisEndpoint::Describe() const {
  std::string out(!unix_path.empty() ? kUnix : tls ? kTls : kPlain);
  if (!user.empty() || !password.empty()) {
    out += user;
    if (!password.empty()) out += ":***";
    out += "@";
  }
  if (!unix_path.empty()) {
    out += unix_path;
    if (db != 0) out += "?db=" + std::to_string(db);
    return out;
  }
  out += Address();
  if (db != 0) out += "/" + std::to_string(db);
  return out;
}

std::string RedisEndpoint::Address() const {
  if (!unix_path.empty()) return "unix:" + unix_path;
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string RedactRedisUrl(std::string_view url) {
  const auto [begin, end] = PasswordSpan(url);
  if (begin == end) return std::string(url);
  std::string out(url.substr(0, begin));
  out += "***";
  out += url.substr(end);
  return out;
}

std::string StripRedisPassword(std::string_view url, std::string* password) {
  password->clear();
  const auto [begin, end] = PasswordSpan(url);
  if (begin == end) return std::string(url);
  if (!PercentDecode(url.substr(begin, end - begin), password))
    password->assign(url.substr(begin, end - begin));
  std::string out(url.substr(0, begin - 1));  // without the ':' before the password
  const bool no_user = begin - 1 == AfterScheme(url);
  out += no_user ? std::string(url.substr(end + 1)) : std::string(url.substr(end));
  return out;
}

Status ParseRedisUrl(std::string_view url, RedisEndpoint* out) {
  std::string shown = RedactRedisUrl(url);  // the URL as messages show it
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(what + " in Redis URL \"" + shown +
                                   "\" (want redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or "
                                   "unix://[USER[:PASSWORD]@]/PATH[?db=DB])");
  };
  RedisEndpoint ep;
  std::string_view rest = url;
  bool unix_socket = false;
  if (rest.substr(0, kTls.size()) == kTls) {
    ep.tls = true;
    rest.remove_prefix(kTls.size());
  } else if (rest.substr(0, kPlain.size()) == kPlain) {
    rest.remove_prefix(kPlain.size());
  } else if (rest.substr(0, kUnix.size()) == kUnix) {
    unix_socket = true;
    rest.remove_prefix(kUnix.size());
  } else if (rest.find("://") != std::string_view::npos) {
    return bad("unknown scheme (redis://, rediss:// or unix://)");
  }
  // USER:PASSWORD@ up to the last '@': a password may hold '@' and '/' (better percent-encoded).
  // For unix:// the path starts at the first '/', so the user part ends before it ('/' in its
  // password: %2F).
  const size_t path = unix_socket ? rest.find('/') : std::string_view::npos;
  const size_t at = path == 0                        ? std::string_view::npos
                    : path == std::string_view::npos ? rest.rfind('@')
                                                     : rest.rfind('@', path - 1);
  if (at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    const size_t colon = userinfo.find(':');
    if (!PercentDecode(userinfo.substr(0, colon), &ep.user)) return bad("bad %-escape in the user");
    if (colon != std::string_view::npos && !PercentDecode(userinfo.substr(colon + 1), &ep.password))
      return bad("bad %-escape in the password");
  }
  if (unix_socket) {
    // /PATH[?db=DB]: the path is everything up to '?'.
    const size_t query = rest.find('?');
    const std::string_view path = rest.substr(0, query);
    if (path.empty() || path[0] != '/')
      return bad("a unix:// URL needs an absolute socket path, unix:///run/redis/redis.sock");
    if (path.size() > kMaxUnixPath)
      return bad("the socket path is longer than " + std::to_string(kMaxUnixPath) + " bytes");
    if (path.find('#') != std::string_view::npos) return bad("'#' in the socket path");
    ep.unix_path = std::string(path);
    if (query != std::string_view::npos) {
      const std::string_view q = rest.substr(query + 1);
      if (q.substr(0, 3) != "db=" || !ParseInt(q.substr(3), 0, 1 << 30, &ep.db))
        return bad("the one query parameter of a unix:// URL is db=NUMBER");
    }
    ep.host.clear();
    ep.port = 0;
    *out = std::move(ep);
    return Status::Ok();
  }
  // No '@': USER:PASSWORD with @HOST left out reads as HOST:PORT[/DB]. When what follows the
  // host's ':' is no port, it may be a password (holding '/', '?' too): from that ':' on,
  // nothing of the URL is shown.
  bool masked = false;
  if (at == std::string_view::npos) {
    const std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
    const size_t close = !authority.empty() && authority[0] == '[' ? authority.find(']') : 0;
    const size_t colon = close == std::string_view::npos ? close : authority.find(':', close);
    int port = 0;
    if (colon != std::string_view::npos &&
        !ParseInt(authority.substr(colon + 1), 1, 65535, &port)) {
      shown = std::string(url.substr(0, url.size() - rest.size() + colon + 1)) + "***";
      masked = true;
    }
  }
  if (rest.find_first_of("?#") != std::string_view::npos)
    return bad("query parameters are not supported (use the --redis-* flags)");
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && !ParseInt(db, 0, 1 << 30, &ep.db))
      return bad(masked ? "bad database (not shown)"
                        : "bad database \"" + std::string(db) + "\" (a number)");
  }
  std::string_view port;
  bool has_port = false;
  if (!hostport.empty() && hostport[0] == '[') {  // [IPv6]:PORT
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) return bad("unclosed '[' around the host");
    ep.host = std::string(hostport.substr(1, close - 1));
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("junk after ']'");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    const size_t colon = hostport.find(':');
    if (colon != std::string_view::npos && hostport.find(':', colon + 1) != std::string_view::npos)
      return bad("an IPv6 address goes in brackets, redis://[::1]:6379");
    ep.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = hostport.substr(colon + 1);
      has_port = true;
    }
  }
  if (ep.host.empty()) return bad("no host");
  if (has_port && !ParseInt(port, 1, 65535, &ep.port))
    return bad(masked ? "bad port (not shown: a password goes as USER:PASSWORD@HOST)"
                      : "bad port \"" + std::string(port) + "\"");
  *out = std::move(ep);
  return Status::Ok();
}

Status ResolveRedisEndpoint(std::string_view url, const RedisAccessFiles& files,
                            RedisEndpoint* out) {
  RedisEndpoint ep;
  FERRY_RETURN_IF_ERROR(ParseRedisUrl(url, &ep));
  if (!files.password_file.empty()) {
    if (!ep.password.empty())
      return Status::InvalidArgument(
          "the Redis password is given twice, in the URL and in --redis-password-file: give it "
          "once (the file keeps it out of the command line)");
    FERRY_RETURN_IF_ERROR(ReadPasswordFile(files.password_file, &ep.password));
  }
  // AUTH needs a password; without one the connection would silently be Redis's default user.
  if (!ep.user.empty() && ep.password.empty())
    return Status::InvalidArgument("the Redis URL \"" + RedactRedisUrl(url) + "\" names user \"" +
                                   ep.user +
                                   "\" but no password: give it with --redis-password-file (or in "
                                   "the URL)");
  ep.tls_ca = files.tls_ca;
  ep.tls_cert = files.tls_cert;
  ep.tls_key = files.tls_key;
  const bool tls_files = !ep.tls_ca.empty() || !ep.tls_cert.empty() || !ep.tls_key.empty();
  if (tls_files && !ep.tls)
    return Status::InvalidArgument(
        "--redis-tls-ca, --redis-tls-cert and --redis-tls-key need a rediss:// URL (TLS), got "
        "\"" +
        RedactRedisUrl(url) + "\"");
  if (ep.tls_cert.empty() != ep.tls_key.empty())
    return Status::InvalidArgument("--redis-tls-cert and --redis-tls-key go together");
  if (ep.tls) FERRY_RETURN_IF_ERROR(CheckTlsFiles(ep));
  *out = std::move(ep);
  return Status::Ok();
}

}  // namespace ferry::protocol
