// ValidateBrokerOptions: every BrokerOptions value in its range, named as the flag that sets it.
#include <string>

#include "ferry/broker/broker.h"

namespace ferry::broker {
namespace {

Status Range(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return Status::Ok();
  return Status::InvalidArgument(std::string(flag) + " must be " + std::to_string(lo) + ".." +
                                 std::to_string(hi) + ", got " + std::to_string(value));
}

}  // namespace

Status ValidateBrokerOptions(const BrokerOptions& o) {
  constexpr int64_t kTenYears = int64_t{10} * 365 * 24 * 3600;
  FERRY_RETURN_IF_ERROR(Range("--heartbeat-ms", o.heartbeat_ms, 10, 600000));
  FERRY_RETURN_IF_ERROR(Range("--liveness", o.liveness, 1, 1000));
  FERRY_RETURN_IF_ERROR(Range("--max-attempts", o.max_attempts, 1, 1000));
  FERRY_RETURN_IF_ERROR(Range("--max-result-ttl-s", o.max_result_ttl_s, 1, kTenYears));
  FERRY_RETURN_IF_ERROR(Range("--result-ttl-s (at most --max-result-ttl-s)", o.default_result_ttl_s,
                              1, o.max_result_ttl_s));
  FERRY_RETURN_IF_ERROR(Range("--max-message-bytes", o.max_message_bytes, 1024, int64_t{1} << 40));
  FERRY_RETURN_IF_ERROR(Range("--max-job-bytes", o.max_job_bytes, 1, int64_t{1} << 40));
  FERRY_RETURN_IF_ERROR(Range("--max-queue", o.max_queue, 1, 1000000000));
  FERRY_RETURN_IF_ERROR(Range("--max-pending-bytes", o.max_pending_bytes, 1, int64_t{1} << 50));
  FERRY_RETURN_IF_ERROR(Range("--aging-every", o.aging_every, 0, 1000000));
  FERRY_RETURN_IF_ERROR(Range("--redis-timeout-ms", o.redis_timeout_ms, 1, 600000));
  // At most the decoder's array limit (codec.cc): a bigger SUBMIT would be malformed, not
  // too_large, while LIMITS promised it.
  FERRY_RETURN_IF_ERROR(Range("--max-jobs-per-message", o.max_jobs_per_message, 1, 65536));
  FERRY_RETURN_IF_ERROR(
      Range("--max-inline-backlog-bytes", o.max_inline_backlog_bytes, 0, int64_t{1} << 40));
  FERRY_RETURN_IF_ERROR(Range("--orphan-timeout-s", o.orphan_timeout_s, 0, kTenYears));
  // -1: any free port (tests); the flag itself takes 0..65535 (main.cc).
  FERRY_RETURN_IF_ERROR(Range("--metrics-port", o.metrics_port, -1, 65535));
  if (o.frontend.empty()) return Status::InvalidArgument("--frontend must not be empty");
  if (o.backend.empty()) return Status::InvalidArgument("--backend must not be empty");
  if (o.frontend == o.backend)
    return Status::InvalidArgument("--frontend and --backend must differ, both are " + o.frontend);
  return Status::Ok();
}

}  // namespace ferry::broker
