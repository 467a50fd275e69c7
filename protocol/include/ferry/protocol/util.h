#pragma once
// Small helpers every component needs: clocks, ids, endpoint parsing, host names.

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::protocol {

// Microseconds since the Unix epoch (wall clock; comparable across hosts with synced clocks).
int64_t NowMicros();
// Microseconds on the monotonic clock (for durations and deadlines inside one process).
int64_t MonotonicMicros();
// A random UUIDv4 in canonical text form (thread-safe).
std::string NewUuid();
std::string HostName();

struct RedisEndpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
};
// Parses redis://HOST:PORT[/DB] (also HOST:PORT).
Status ParseRedisUrl(std::string_view url, RedisEndpoint* out);

}  // namespace ferry::protocol
