#include "ferry/protocol/util.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>

namespace ferry::protocol {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t MonotonicMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string NewUuid() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(getpid())};
    return std::mt19937_64(seq);
  }());
  uint64_t hi = rng(), lo = rng();
  hi = (hi & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 10
  char buf[37];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%012llx",
                static_cast<unsigned>(hi >> 32), static_cast<unsigned>((hi >> 16) & 0xFFFF),
                static_cast<unsigned>(hi & 0xFFFF), static_cast<unsigned>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return buf;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

Status ParseRedisUrl(std::string_view url, RedisEndpoint* out) {
  std::string_view rest = url;
  constexpr std::string_view kScheme = "redis://";
  if (rest.substr(0, kScheme.size()) == kScheme) rest.remove_prefix(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string db(rest.substr(slash + 1));
    if (!db.empty()) {
      try {
        out->db = std::stoi(db);
      } catch (...) {
        return Status::InvalidArgument("bad Redis database in \"" + std::string(url) + "\"");
      }
    }
  }
  size_t colon = hostport.rfind(':');
  if (colon == std::string_view::npos) {
    out->host = std::string(hostport);
  } else {
    out->host = std::string(hostport.substr(0, colon));
    try {
      out->port = std::stoi(std::string(hostport.substr(colon + 1)));
    } catch (...) {
      return Status::InvalidArgument("bad Redis port in \"" + std::string(url) + "\"");
    }
  }
  if (out->host.empty() || out->port <= 0 || out->port > 65535)
    return Status::InvalidArgument("bad Redis URL \"" + std::string(url) + "\"");
  return Status::Ok();
}

}  // namespace ferry::protocol
