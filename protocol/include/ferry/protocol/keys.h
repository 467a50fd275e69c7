#pragma once
// Redis key layout (docs/protocol.md, "Redis keys"). Every key starts with a configurable
// prefix, "ferry:" by default, so several fleets can share one Redis.

#include <string>
#include <string_view>

namespace ferry::protocol {

inline constexpr std::string_view kDefaultPrefix = "ferry:";
// The expiry of a result whose job sets none: the broker's --result-ttl-s default, and the
// worker's fallback for a CHUNK entry without one (a broker always sends one).
inline constexpr int64_t kDefaultResultTtlS = 600;

class Keys {
 public:
  explicit Keys(std::string prefix = std::string(kDefaultPrefix)) : prefix_(std::move(prefix)) {}
  // The final result of a job: a msgpack map, written once (SET NX) with an expiry.
  std::string Result(std::string_view id) const {
    std::string k;
    k.reserve(prefix_.size() + 7 + id.size());
    k.append(prefix_).append("result:").append(id);
    return k;
  }
  // A stored job input: the raw bytes of input `index` of job `id`, written by the producer
  // (with an expiry) before its SUBMIT, read by the worker, deleted with the job's final result.
  std::string Input(std::string_view id, size_t index) const {
    std::string k;
    k.reserve(prefix_.size() + 8 + id.size() + 4);
    k.append(prefix_).append("input:").append(id).append(":").append(std::to_string(index));
    return k;
  }
  // The broker's journal: a HASH of job id -> msgpack record of every accepted, unfinished job.
  std::string Journal() const { return prefix_ + "journal"; }
  // Models ever announced by a worker (a SET; expires a week after the last announcement).
  std::string Models() const { return prefix_ + "models"; }
  // A producer's Pub/Sub channel for result notices straight from workers ("notify" in SUBMIT):
  // prefix + "notify:" + a token of 1-128 characters of [A-Za-z0-9._:-] (the SDK: a UUIDv4).
  std::string NotifyChannel(std::string_view token) const {
    return prefix_ + "notify:" + std::string(token);
  }
  // Whether `channel` is one NotifyChannel could make (with any valid token).
  bool IsNotifyChannel(std::string_view channel) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
};

}  // namespace ferry::protocol
