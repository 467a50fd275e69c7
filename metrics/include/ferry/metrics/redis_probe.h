#pragma once
// RedisProbe: a thread that asks Redis every few seconds whether it answers (PING), and
// optionally how much memory it uses (INFO memory), on a connection of its own, so that a Redis
// that hangs never stalls the process's own loops. It keeps
//   ferry_redis_up                   gauge, 1 when the last probe got an answer, else 0
//   ferry_redis_used_memory_bytes    gauge, INFO memory used_memory      (with `memory`)
//   ferry_redis_maxmemory_bytes      gauge, INFO memory maxmemory (0: no limit; with `memory`)
// and Up() for /readyz and /healthz. Any reply counts as an answer, an error reply too (an ACL
// user without +ping is still talking to a live Redis); INFO needs +info in the user's ACL, and
// without it the memory gauges are simply absent. Up() is false, with the reason, also while
// Redis answers but would refuse writes: a PING answered LOADING, BUSY, MASTERDOWN (the
// passing errors of IsTransientRedisError), or (with `memory`) used_memory at maxmemory under
// maxmemory-policy noeviction -- every SUBMIT would be rejected then.
//
// Thread-safety: Up() from any thread; construct and destroy on one.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"

namespace ferry::metrics {

class Registry;
class Gauge;

class RedisProbe {
 public:
  struct Options {
    protocol::RedisEndpoint endpoint;
    int timeout_ms = 1000;   // of each probe's connect and round trip
    int interval_ms = 2000;  // between probes
    bool memory = false;     // also INFO memory (the broker; one per fleet is enough)
  };
  // Starts the thread; the first probe runs at once. `registry` must outlive the probe.
  RedisProbe(Registry* registry, Options options);
  ~RedisProbe();  // stops and joins
  RedisProbe(const RedisProbe&) = delete;
  RedisProbe& operator=(const RedisProbe&) = delete;

  // True when the last probe got an answer; else false and *why ("redis://HOST:PORT
  // unreachable: ..." -- the URL without its password -- or "redis not probed yet").
  bool Up(std::string* why) const;

 private:
  void Loop();

  const Options options_;
  Gauge* up_;
  Gauge* used_memory_ = nullptr;
  Gauge* max_memory_ = nullptr;
  Registry* registry_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool up_now_ = false;
  std::string why_ = "redis not probed yet";
  std::thread thread_;
};

// The text of `field:` in an INFO reply ("run_id:9f3c...\r\n"), up to the line's end; "" when
// absent.
std::string InfoText(const std::string& info, const std::string& field);

}  // namespace ferry::metrics
