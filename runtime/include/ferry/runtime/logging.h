#pragma once
// Log setup shared by ferry-broker, ferry-worker and `ferry up`: the level, and either spdlog's
// human-readable lines or, with --log-json, one JSON object per line for log shippers:
//
//   {"ts":"2026-11-22T10:15:02.123456Z","level":"info","component":"broker","pid":41,
//    "tid":41,"msg":"worker host:gpu0 joined on cuda:0 (capacity 96, models tiny)"}
//
// plus the fields that identify what the line is about, where the code that logs knows them:
// "job_id", "model", "worker" (a worker sets "worker" for the whole process), e.g.
//   {..., "worker":"host:41:cuda:0","model":"tiny","job_id":"3f2a...","msg":"..."}
// In text mode every message is one line: CR, LF and other control characters are escaped
// ("\n"), so a model's multi-line error stays on the line of its event.
//
// `ts` is UTC with microseconds; `level` is spdlog's name (trace, debug, info, warn, error,
// critical); `msg` is the formatted message, JSON-escaped (quotes, backslashes, control
// characters; invalid UTF-8 becomes U+FFFD), so every line parses as JSON whatever was logged.
//
// Lives in its own small library (ferry::logging) so that ferry::protocol, which the SDK
// installs, does not depend on spdlog. Thread-safety: Configure once, from main, before other
// threads log; the formatter itself is used under spdlog's sink lock like any other.

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/formatter.h>

#include "ferry/status.h"

namespace ferry::logging {

// Sets the default logger's level ("trace", "debug", "info", "warn", "error", "critical",
// "off") and, when `json`, its format to JSON lines tagged with `component` ("broker",
// "worker", "cli"). Fails with invalid_argument on an unknown level (nothing changed then).
Status Configure(const std::string& level, bool json, const std::string& component);

// The JSON-lines formatter Configure installs; public for tests and other loggers.
std::unique_ptr<spdlog::formatter> MakeJsonFormatter(const std::string& component);

// The text-mode formatter Configure installs: spdlog's default pattern, the message on one line.
std::unique_ptr<spdlog::formatter> MakeTextFormatter();

// While it lives, JSON log lines written by this thread carry these fields (nested scopes add
// up; keys "job_id", "model", "worker" by convention). Text lines are unchanged: put the ids
// in the message too. Cheap: a push to a thread-local vector.
//   logging::LogFields fields({{"model", name}, {"job_id", id}});
//   spdlog::warn("model {}: job {} failed: {}", name, id, why);
class LogFields {
 public:
  LogFields(std::initializer_list<std::pair<std::string, std::string>> fields);
  ~LogFields();
  LogFields(const LogFields&) = delete;
  LogFields& operator=(const LogFields&) = delete;

 private:
  size_t n_;
};

// A field every JSON line of the process carries from now on (e.g. "worker" = its name); an
// empty value removes it. Thread-safe.
void SetProcessField(const std::string& key, const std::string& value);

// `s` with CR, LF and control characters escaped ("\n", "\r", "\x01"; a tab becomes a
// space), appended to *out: one log line whatever the text.
void AppendOneLine(std::string_view s, std::string* out);

// `s` cut to at most `max_bytes` on a UTF-8 character boundary, with "... (N more bytes)"
// added when cut: for long texts (model errors) in log lines, never cut mid-character silently.
std::string Clip(std::string_view s, size_t max_bytes);

// Appends `s` as the inside of a JSON string (no quotes) to *out.
void AppendJsonEscaped(std::string_view s, std::string* out);

}  // namespace ferry::logging
