#pragma once
// RedisStore: what the SDK reads and writes in Redis itself, on the calling thread: job results
// (<prefix>result:<id>) for Poll and Wait, one GET per id; and the inputs it stores for the
// workers (<prefix>input:<id>:<index>, see ClientOptions::stored_input_bytes).
//
// protocol::RedisClient is not thread-safe, so the store keeps a small pool of connections:
// a caller takes one (or opens a new one), uses it alone and gives it back. At most
// kMaxIdle connections are kept between calls; bursts beyond that open short-lived extras.
//
// Thread-safety: every method may be called from any number of threads at once.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/result.h"
#include "ferry/status.h"

namespace ferry::client {

class RedisStore {
 public:
  static constexpr size_t kMaxIdle = 8;

  RedisStore(protocol::RedisEndpoint endpoint, std::string prefix, int timeout_ms)
      : endpoint_(std::move(endpoint)), keys_(std::move(prefix)), timeout_ms_(timeout_ms) {}

  // One GET. No record: ok with out->state == kPending. Else the decoded record; with
  // `consume`, deleted once it has come whole (DeleteResults' way; best effort: one it cannot
  // delete expires), never before: a read cut off (a timeout, a dropped connection) loses
  // nothing. `timeout_ms` (> 0) bounds this read instead of the store's timeout when it is
  // shorter. Errors: unavailable (Redis unreachable, or no answer in time),
  // malformed/invalid_argument (not a result record).
  Status Read(const std::string& id, Result* out, bool consume = false, int timeout_ms = 0);

  // Writes values[i] under keys[i], each expiring after ttl_s, in one pipelined round trip
  // (bounded by `timeout_ms` (> 0) instead of the store's timeout when it is shorter).
  // unavailable when Redis cannot be reached; internal when it refuses a write.
  Status PutInputs(const std::vector<std::string>& keys,
                   const std::vector<std::string_view>& values, int64_t ttl_s, int timeout_ms = 0);
  // Deletes the results of `ids` in one round trip: DEL, or for an ACL user that may not DEL
  // results (one set up before this SDK: GETDEL only) GETDEL, whose values are skipped as they
  // arrive; after one NOPERM, GETDEL from then on.
  Status DeleteResults(const std::vector<std::string>& ids);
  // Deletes `keys` (one round trip; a second, on a new connection, when the first connection
  // was found broken: Redis may have closed a pooled one, as it does after a protocol error).
  // With `timeout_ms` (> 0, shorter than the store's): one round trip within it.
  Status Delete(const std::vector<std::string>& keys, int timeout_ms = 0);

 private:
  // A pooled connection, or a new one. With `timeout_ms` > 0 and shorter than the store's, it is
  // bounded by that (connecting, and each operation) and *bounded says so: Release then sets the
  // store's timeout back before it goes to the pool.
  Status Acquire(std::unique_ptr<protocol::RedisClient>* out, int timeout_ms = 0,
                 bool* bounded = nullptr);
  void Release(std::unique_ptr<protocol::RedisClient> conn, bool bounded = false);
  // DEL of result keys on `conn`, or GETDEL (values skipped) once Redis said NOPERM to DEL.
  Status DeleteResultKeys(protocol::RedisClient* conn, const std::vector<std::string_view>& keys);

  const protocol::RedisEndpoint endpoint_;
  const protocol::Keys keys_;
  const int timeout_ms_;
  std::mutex mu_;
  std::vector<std::unique_ptr<protocol::RedisClient>> idle_;  // guarded by mu_
  std::atomic<bool> del_refused_{false};  // Redis answered NOPERM to DEL on results
};

}  // namespace ferry::client
