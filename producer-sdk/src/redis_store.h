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

  // One GET (GETDEL with `consume`: the record is deleted as it is read). No record: ok with
  // out->state == kPending. Else the decoded record. Errors: unavailable (Redis unreachable),
  // malformed/invalid_argument (not a result record).
  Status Read(const std::string& id, Result* out, bool consume = false);

  // Writes values[i] under keys[i], each expiring after ttl_s, in one pipelined round trip.
  // unavailable when Redis cannot be reached; internal when it refuses a write.
  Status PutInputs(const std::vector<std::string>& keys,
                   const std::vector<std::string_view>& values, int64_t ttl_s);
  // Deletes the results of `ids` in one pipelined round trip (GETDEL, which the producer's ACL
  // user may run; the values are dropped): results the client got inline under
  // consume_results (result_deleter.h).
  Status DeleteResults(const std::vector<std::string>& ids);
  // Deletes `keys` (one round trip).
  Status Delete(const std::vector<std::string>& keys);

 private:
  Status Acquire(std::unique_ptr<protocol::RedisClient>* out);
  void Release(std::unique_ptr<protocol::RedisClient> conn);

  const protocol::RedisEndpoint endpoint_;
  const protocol::Keys keys_;
  const int timeout_ms_;
  std::mutex mu_;
  std::vector<std::unique_ptr<protocol::RedisClient>> idle_;  // guarded by mu_
};

}  // namespace ferry::client
