#pragma once
// ResultDeleter: deletes, in the background, the results a consuming client (ClientOptions::
// consume_results) got inline in a notice and so never read from Redis (one it read, it deletes
// right after: RedisStore::Read). A thread of its own takes the ids queued since its last round
// trip and deletes them all in one round trip (DEL; GETDEL for an ACL user that may not DEL
// results: RedisStore::DeleteResults), so a Wait never waits on the deletion and busy clients
// delete hundreds of results per round trip.
//
// Best effort, bounded: at most kMaxQueued ids wait (beyond that new ones are dropped and expire
// with their result_ttl_s), and a failed round trip is not retried (the same). The destructor
// waits for a round trip in progress, then makes at most one more (kMaxPerRoundTrip ids, none
// if the one before failed), then joins; whatever is still queued is dropped and expires. So
// with Redis unreachable it blocks for about two round trips (each bounded by the store's
// timeout, request_timeout_ms) at most, however much is queued.
//
// Thread-safety: Add from any thread.

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redis_store.h"

namespace ferry::client {

class ResultDeleter {
 public:
  static constexpr size_t kMaxQueued = 100000;
  static constexpr size_t kMaxPerRoundTrip = 1000;

  // `store` must outlive the deleter. The thread starts with the first Add.
  explicit ResultDeleter(RedisStore* store) : store_(store) {}
  ~ResultDeleter();
  ResultDeleter(const ResultDeleter&) = delete;
  ResultDeleter& operator=(const ResultDeleter&) = delete;

  void Add(const std::string& id);

 private:
  void Loop();

  RedisStore* store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> queued_;  // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::thread thread_;               // started under mu_ by the first Add
};

}  // namespace ferry::client
