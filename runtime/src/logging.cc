#include "ferry/runtime/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <utility>
#include <vector>

namespace ferry::logging {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    min = 0x10000;
  } else
    return 0;
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// This thread's LogFields (innermost last), and the process's SetProcessField fields.
thread_local std::vector<std::pair<std::string, std::string>> t_fields;
std::mutex g_process_mu;
std::vector<std::pair<std::string, std::string>> g_process_fields;

void AppendField(const std::string& key, const std::string& value, std::string* line) {
  *line += ",\"";
  AppendJsonEscaped(key, line);
  *line += "\":\"";
  AppendJsonEscaped(value, line);
  *line += '"';
}

// Text mode: spdlog's own pattern, with the message made one line -- CR, LF and other control
// characters escaped (a model error's traceback becomes "...\n  File ..." on one line).
class OneLineFormatter final : public spdlog::formatter {
 public:
  OneLineFormatter() : inner_(std::make_unique<spdlog::pattern_formatter>()) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    bool plain = true;
    for (char c : payload) plain = plain && static_cast<unsigned char>(c) >= 0x20 && c != 0x7F;
    if (plain) return inner_->format(msg, dest);
    escaped_.clear();
    AppendOneLine(payload, &escaped_);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(escaped_.data(), escaped_.size());
    inner_->format(copy, dest);
    msg.color_range_start = copy.color_range_start;  // mutable: the color sink reads them
    msg.color_range_end = copy.color_range_end;
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<OneLineFormatter>();
  }

 private:
  std::unique_ptr<spdlog::formatter> inner_;
  std::string escaped_;  // reused; format() runs under the sink's lock
};

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string component) : component_(std::move(component)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    line_.clear();
    line_ += "{\"ts\":\"";
    const auto since = msg.time.time_since_epoch();
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(since);
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since - secs);
    const std::time_t t = static_cast<std::time_t>(secs.count());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[96];  // room for any int in each field: GCC 13's -Wformat-truncation counts so
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(micros.count()));
    line_ += ts;
    line_ += "\",\"level\":\"";
    const auto level = spdlog::level::to_string_view(msg.level);
    line_.append(level.data(), level.size());
    line_ += '"';
    if (!component_.empty()) {
      line_ += ",\"component\":\"";
      AppendJsonEscaped(component_, &line_);
      line_ += '"';
    }
    if (msg.logger_name.size() > 0) {
      line_ += ",\"logger\":\"";
      AppendJsonEscaped(std::string_view(msg.logger_name.data(), msg.logger_name.size()), &line_);
      line_ += '"';
    }
    line_ += ",\"pid\":" + std::to_string(pid_);
    line_ += ",\"tid\":" + std::to_string(msg.thread_id);
    {
      std::lock_guard<std::mutex> lock(g_process_mu);
      for (const auto& [k, v] : g_process_fields) AppendField(k, v, &line_);
    }
    // The calling thread's fields: spdlog's default logger formats on the calling thread.
    for (const auto& [k, v] : t_fields) AppendField(k, v, &line_);
    line_ += ",\"msg\":\"";
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), &line_);
    line_ += "\"}\n";
    dest.append(line_.data(), line_.data() + line_.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(component_);
  }

 private:
  const std::string component_;
  const long pid_ = static_cast<long>(getpid());
  std::string line_;  // reused; format() runs under the sink's lock
};

}  // namespace

void AppendJsonEscaped(std::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8Length(s, i);
      if (n == 0) {
        *out += "\\ufffd";
        ++i;
      } else {
        out->append(s.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          *out += "\\u00";
          *out += kHex[c >> 4];
          *out += kHex[c & 0xF];
        } else {
          *out += static_cast<char>(c);
        }
    }
    ++i;
  }
}

void AppendOneLine(std::string_view s, std::string* out) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += ' ';
    } else if (u < 0x20 || u == 0x7F) {
      static const char kHex[] = "0123456789abcdef";
      *out += "\\x";
      *out += kHex[u >> 4];
      *out += kHex[u & 0xF];
    } else {
      *out += c;
    }
  }
}

std::string Clip(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = max_bytes;
  // Back off to the start of a UTF-8 sequence: never half a character.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "... (" + std::to_string(s.size() - cut) + " more bytes)";
}

LogFields::LogFields(std::initializer_list<std::pair<std::string, std::string>> fields)
    : n_(fields.size()) {
  for (const auto& f : fields) t_fields.push_back(f);
}

LogFields::~LogFields() { t_fields.resize(t_fields.size() - n_); }

void SetProcessField(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(g_process_mu);
  for (auto it = g_process_fields.begin(); it != g_process_fields.end(); ++it) {
    if (it->first != key) continue;
    if (value.empty())
      g_process_fields.erase(it);
    else
      it->second = value;
    return;
  }
  if (!value.empty()) g_process_fields.emplace_back(key, value);
}

std::unique_ptr<spdlog::formatter> MakeTextFormatter() {
  return std::make_unique<OneLineFormatter>();
}

std::unique_ptr<spdlog::formatter> MakeJsonFormatter(const std::string& component) {
  return std::make_unique<JsonFormatter>(component);
}

Status Configure(const std::string& level, bool json, const std::string& component) {
  static const char* kLevels[] = {"trace", "debug", "info",     "warn", "warning",
                                  "error", "err",   "critical", "off"};
  bool known = false;
  for (const char* l : kLevels) known = known || level == l;
  if (!known) return Status::InvalidArgument("unknown log level \"" + level + "\"");
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_formatter(json ? MakeJsonFormatter(component) : MakeTextFormatter());
  return Status::Ok();
}

}  // namespace ferry::logging
