#pragma once
// ResultStore: reads job results from Redis (<prefix>result:<id>) for Poll and Wait, one GET
// per id or one MGET for many.
//
// protocol::RedisClient is not thread-safe, so the store keeps a small pool of connections:
// a reader takes one (or opens a new one), uses it alone and gives it back. At most
// kMaxIdle connections are kept between calls; bursts beyond that open short-lived extras.
//
// Thread-safety: Read may be called from any number of threads at once.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/result.h"
#include "ferry/status.h"

namespace ferry::client {

class ResultStore {
 public:
  static constexpr size_t kMaxIdle = 8;

  ResultStore(protocol::RedisEndpoint endpoint, std::string prefix, int timeout_ms)
      : endpoint_(std::move(endpoint)), keys_(std::move(prefix)), timeout_ms_(timeout_ms) {}

  // One GET. No record: ok with out->state == kPending. Else the decoded record.
  // Errors: unavailable (Redis unreachable), malformed/invalid_argument (not a result record).
  Status Read(const std::string& id, Result* out);

  // One id's outcome in ReadMany: status as Read's, the decoded result (kPending when there is
  // no record), and the record's size in bytes.
  struct Fetched {
    Status status;
    Result result;
    size_t bytes = 0;
  };
  // One MGET for all ids (one round trip); (*out)[i] belongs to ids[i]. A transport failure
  // fails the whole call (unavailable); a bad record fails only its own entry.
  Status ReadMany(const std::vector<std::string>& ids, std::vector<Fetched>* out);

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
