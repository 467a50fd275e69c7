#pragma once
// Small helpers every component needs: clocks, ids, endpoint parsing, host names.

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/protocol/redis_endpoint.h"  // RedisEndpoint, ParseRedisUrl
#include "ferry/status.h"

namespace ferry::protocol {

// Microseconds since the Unix epoch (wall clock; comparable across hosts with synced clocks).
int64_t NowMicros();
// Microseconds on the monotonic clock (for durations and deadlines inside one process).
int64_t MonotonicMicros();
// A random UUIDv4 in canonical text form (thread-safe).
std::string NewUuid();
std::string HostName();

// `s` made safe to log or print: control characters, DEL and bytes >= 0x80 become '?', and at
// most `max` characters are kept ("..." marks a cut). For names and messages that came from the
// network, so that a peer cannot write into an operator's terminal or break a log line.
std::string Printable(std::string_view s, size_t max = 128);

}  // namespace ferry::protocol
