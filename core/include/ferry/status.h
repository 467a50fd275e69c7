#pragma once
// ferry::Status: the result of an operation that can fail, as a value (no exceptions cross a
// component boundary). An OK status has an empty code. A failed one carries a machine-readable
// code -- the same snake_case strings that travel on the wire and land in Redis ("unknown_model",
// "queue_full", ...; see docs/protocol.md) -- and a human-readable message.
//
// Thread-safety: a Status is a plain value; distinct objects may be used from distinct threads.
// Public header: includes only the standard library.

#include <string>
#include <utility>

namespace ferry {

// Status codes used across Ferry. They are strings so that producers written in any language
// can match them without a table of numbers.
namespace codes {
inline constexpr const char* kInvalidArgument = "invalid_argument";  // caller's input is wrong
inline constexpr const char* kUnknownModel = "unknown_model";        // no worker serves it
inline constexpr const char* kDuplicate = "duplicate";               // id already pending
inline constexpr const char* kQueueFull = "queue_full";              // retryable backpressure
inline constexpr const char* kUnavailable = "unavailable";           // retryable: peer down
inline constexpr const char* kTimeout = "timeout";                   // a wait ran out
inline constexpr const char* kNotFound = "not_found";                // no such job/result
inline constexpr const char* kModelError = "model_error";            // the model raised
inline constexpr const char* kTooLarge = "too_large";                // payload over a limit
inline constexpr const char* kMalformed = "malformed";               // undecodable message
inline constexpr const char* kInternal = "internal";                 // a bug or library failure
// Codes of final results that did not come from running the model (the result's "status" is
// "cancelled"/"expired" for the first two, "failed" for poisoned).
inline constexpr const char* kCancelled = "cancelled";  // cancelled by request before it ran
inline constexpr const char* kExpired = "expired";      // not started within its timeout_ms
inline constexpr const char* kPoisoned = "poisoned";  // workers died running it max_attempts times
}  // namespace codes

class Status {
 public:
  Status() = default;  // OK
  Status(std::string code, std::string message)
      : code_(std::move(code)), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {codes::kInvalidArgument, std::move(m)}; }
  static Status Unavailable(std::string m) { return {codes::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {codes::kInternal, std::move(m)}; }
  static Status NotFound(std::string m) { return {codes::kNotFound, std::move(m)}; }
  static Status Timeout(std::string m) { return {codes::kTimeout, std::move(m)}; }

  bool ok() const { return code_.empty(); }
  const std::string& code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ok", or "code: message".
  std::string ToString() const { return ok() ? "ok" : code_ + ": " + message_; }

  // True for failures where the same request may succeed later (queue_full, unavailable).
  bool retryable() const { return code_ == codes::kQueueFull || code_ == codes::kUnavailable; }

 private:
  std::string code_;
  std::string message_;
};

}  // namespace ferry

// Returns early from the calling function when `expr` yields a failed Status.
#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::ferry::Status _ferry_status = (expr);        \
    if (!_ferry_status.ok()) return _ferry_status; \
  } while (0)
