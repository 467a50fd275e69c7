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
// time: the caller must not retry that write forever. Redis before 7.0 wraps an error raised
// inside a script ("ERR Error running script (call to f_...): @user_script:1: -OOM command not
// allowed ..."); 7.0 and later keep its code in front ("OOM command not allowed ... script: ...").
inline bool IsTransientRedisError(std::string_view error) {
  const bool in_script = error.find("Error running script") != std::string_view::npos;
  for (std::string_view code : {"LOADING", "BUSY", "READONLY", "OOM", "MASTERDOWN", "TRYAGAIN",
                                "CLUSTERDOWN", "NOREPLICAS", "MISCONF"}) {
    // The code as a word: at the start, or after a '-' in a wrapped script error; then a space
    // or the end (BUSYGROUP is not BUSY).
    for (size_t at = error.find(code); at != std::string_view::npos;
         at = error.find(code, at + 1)) {
      const size_t end = at + code.size();
      const bool word = end == error.size() || error[end] == ' ';
      if (word && (at == 0 || (in_script && error[at - 1] == '-'))) return true;
    }
  }
  return false;
}

// True for an ACL refusal: NOPERM, or one inside a script, which carries no NOPERM: "The user
// executing the script can't ..." (Redis 7.0), "ACL failure in script: ..." (Valkey 9).
inline bool IsAclRefusal(std::string_view error) {
  for (std::string_view text : {"NOPERM", "user executing the script", "ACL failure in script"}) {
    if (error.find(text) != std::string_view::npos) return true;
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
