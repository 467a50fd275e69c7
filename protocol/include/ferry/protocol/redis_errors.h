#pragma once
// What a Redis error reply means for a write that got it: try again later, or never; and the
// limits Redis puts on what Ferry writes.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferry::protocol {

// True for error replies that go away by themselves (the server is loading, busy running a
// script, a read-only replica, out of memory, failing over): the write is retried. Anything else
// (ERR invalid expire time, WRONGTYPE, NOPERM, an unknown command) will fail the same way every
// time: the caller must not retry that write forever.
inline bool IsTransientRedisError(std::string_view error) {
  for (std::string_view prefix : {"LOADING", "BUSY", "READONLY", "OOM", "MASTERDOWN", "TRYAGAIN",
                                  "CLUSTERDOWN", "NOREPLICAS", "MISCONF"}) {
    if (error.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// The longest expiry Ferry asks Redis for (10 years): Redis refuses an EX whose deadline
// overflows its millisecond clock (2^62 s did), and no result needs to outlive this.
inline constexpr int64_t kMaxExpirySeconds = 10ll * 365 * 24 * 3600;

// The most tensor bytes Ferry puts in one Redis value (a stored input, a journal record, a result
// record): Redis refuses a value over 512 MiB (its default proto-max-bulk-len) by dropping the
// connection, and a record has a head besides its tensors.
inline constexpr size_t kMaxValueDataBytes = (size_t{512} << 20) - (size_t{1} << 20);

}  // namespace ferry::protocol
