#pragma once
// Log setup shared by ferry-broker, ferry-worker and `ferry up`: the level, and either spdlog's
// human-readable lines or, with --log-json, one JSON object per line for log shippers:
//
//   {"ts":"2026-11-22T10:15:02.123456Z","level":"info","component":"broker","pid":41,
//    "tid":41,"msg":"worker host:gpu0 joined on cuda:0 (capacity 96, models tiny)"}
//
// `ts` is UTC with microseconds; `level` is spdlog's name (trace, debug, info, warn, error,
// critical); `msg` is the formatted message, JSON-escaped (quotes, backslashes, control
// characters; invalid UTF-8 becomes U+FFFD), so every line parses as JSON whatever was logged.
//
// Lives in its own small library (ferry::logging) so that ferry::protocol, which the SDK
// installs, does not depend on spdlog. Thread-safety: Configure once, from main, before other
// threads log; the formatter itself is used under spdlog's sink lock like any other.

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/formatter.h>

#include "ferry/status.h"

namespace ferry::logging {

// Sets the default logger's level ("trace", "debug", "info", "warn", "error", "critical",
// "off") and, when `json`, its format to JSON lines tagged with `component` ("broker",
// "worker", "cli"). Fails with invalid_argument on an unknown level (nothing changed then).
Status Configure(const std::string& level, bool json, const std::string& component);

// The JSON-lines formatter Configure installs; public for tests and other loggers.
std::unique_ptr<spdlog::formatter> MakeJsonFormatter(const std::string& component);

// Appends `s` as the inside of a JSON string (no quotes) to *out.
void AppendJsonEscaped(std::string_view s, std::string* out);

}  // namespace ferry::logging
