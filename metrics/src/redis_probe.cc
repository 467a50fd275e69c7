#include "ferry/metrics/redis_probe.h"

#include <chrono>
#include <vector>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/redis_errors.h"

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

std::string InfoText(const std::string& info, const std::string& field) {
  const std::string key = "\n" + field + ":";
  const std::string text = "\n" + info;
  size_t at = text.find(key);
  if (at == std::string::npos) return "";
  at += key.size();
  return text.substr(at, text.find_first_of("\r\n", at) - at);
}

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
    std::string refuses;  // why Redis answers but would refuse Ferry's writes now
    if (s.ok() && options_.memory && replies.size() == 2 &&
        replies[1].type == protocol::RedisReply::Type::kString) {
      used = InfoField(replies[1].str, "used_memory");
      max = InfoField(replies[1].str, "maxmemory");
      if (max > 0 && used >= max && InfoText(replies[1].str, "maxmemory_policy") == "noeviction")
        refuses = "at its maxmemory with noeviction: writes are refused (OOM)";
    }
    if (s.ok() && !replies.empty() && replies[0].type == protocol::RedisReply::Type::kError &&
        protocol::IsTransientRedisError(replies[0].str))
      refuses = "answers " + replies[0].str;  // LOADING, BUSY, MASTERDOWN, ...
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
    up_now_ = s.ok() && refuses.empty();
    why_ = !s.ok()           ? options_.endpoint.Describe() + " unreachable: " + s.message()
           : refuses.empty() ? ""
                             : options_.endpoint.Describe() + " " + refuses;
    cv_.wait_for(lock, std::chrono::milliseconds(options_.interval_ms), [this] { return stop_; });
  }
}

}  // namespace ferry::metrics
