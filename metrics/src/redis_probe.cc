#include "ferry/metrics/redis_probe.h"

#include <chrono>
#include <vector>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "ferry/protocol/redis.h"

namespace ferry::metrics {
namespace {

// The value of `field:` in an INFO reply ("used_memory:1234\r\n"); -1 when absent.
double InfoField(const std::string& info, const std::string& field) {
  const std::string key = "\n" + field + ":";
  size_t at = ("\n" + info).find(key);
  if (at == std::string::npos) return -1;
  at += field.size() + 1;  // "\n" added in front shifts by one, the ':' by another
  try {
    return std::stod(info.substr(at));
  } catch (...) {
    return -1;
  }
}

}  // namespace

RedisProbe::RedisProbe(Registry* registry, Options options)
    : options_(std::move(options)), registry_(registry) {
  up_ = registry_->Gauge(names::kRedisUp, names::kRedisUpHelp);
  thread_ = std::thread([this] { Loop(); });
}

RedisProbe::~RedisProbe() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool RedisProbe::Up(std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!up_now_) *why = why_;
  return up_now_;
}

void RedisProbe::Loop() {
  auto client = protocol::RedisClient::Lazy(options_.endpoint, options_.timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    // PING (and INFO memory) in one round trip. Transport failures fail Flush; an error reply
    // (e.g. NOPERM for a user without +info) still proves Redis answers.
    client->Append({"PING"});
    if (options_.memory) client->Append({"INFO", "memory"});
    std::vector<protocol::RedisReply> replies;
    Status s = client->Flush(&replies);
    double used = -1, max = -1;
    if (s.ok() && options_.memory && replies.size() == 2 &&
        replies[1].type == protocol::RedisReply::Type::kString) {
      used = InfoField(replies[1].str, "used_memory");
      max = InfoField(replies[1].str, "maxmemory");
    }
    up_->Set(s.ok() ? 1 : 0);
    if (used >= 0) {
      if (!used_memory_) {
        used_memory_ = registry_->Gauge(names::kRedisUsedMemory, names::kRedisUsedMemoryHelp);
        max_memory_ = registry_->Gauge(names::kRedisMaxMemory, names::kRedisMaxMemoryHelp);
      }
      used_memory_->Set(used);
      max_memory_->Set(max < 0 ? 0 : max);
    }
    lock.lock();
    up_now_ = s.ok();
    why_ = s.ok() ? "" : options_.endpoint.Describe() + " unreachable: " + s.message();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.interval_ms), [this] { return stop_; });
  }
}

}  // namespace ferry::metrics
