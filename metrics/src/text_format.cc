#include "ferry/metrics/text_format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace ferry::metrics {
namespace {

bool IsNameChar(char c, bool first) {
  bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
  return alpha || (!first && c >= '0' && c <= '9');
}

bool ParseDouble(const std::string& s, double* out) {
  if (s == "+Inf" || s == "Inf")
    *out = std::numeric_limits<double>::infinity();
  else if (s == "-Inf")
    *out = -std::numeric_limits<double>::infinity();
  else if (s == "NaN")
    *out = std::numeric_limits<double>::quiet_NaN();
  else {
    if (s.empty()) return false;
    char* end = nullptr;
    *out = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
  }
  return true;
}

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      out += n == 'n' ? '\n' : n;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Parses `name{labels} value [timestamp]`.
bool ParseSample(const std::string& line, Sample* out) {
  size_t i = 0;
  while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
  if (i == 0) return false;
  out->name = line.substr(0, i);
  out->labels.clear();
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      while (i < line.size() && line[i] == ' ') ++i;
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      size_t start = i;
      while (i < line.size() && IsNameChar(line[i], i == start) && line[i] != ':') ++i;
      if (i == start || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') return false;
      std::string key = line.substr(start, i - start);
      i += 2;
      std::string value;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\') {
          if (++i >= line.size()) return false;
          value += line[i] == 'n' ? '\n' : line[i];
        } else {
          value += line[i];
        }
        ++i;
      }
      if (i >= line.size()) return false;
      ++i;  // closing quote
      out->labels[key] = value;
      while (i < line.size() && line[i] == ' ') ++i;
      if (i < line.size() && line[i] == ',') {
        ++i;
        continue;
      }
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      return false;
    }
  }
  if (i >= line.size() || (line[i] != ' ' && line[i] != '\t')) return false;
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  size_t end = line.find_first_of(" \t", i);
  std::string value = line.substr(i, end == std::string::npos ? std::string::npos : end - i);
  if (!ParseDouble(value, &out->value)) return false;
  if (end != std::string::npos) {  // optional integer timestamp
    size_t ts = line.find_first_not_of(" \t", end);
    if (ts != std::string::npos) {
      char* stop = nullptr;
      std::strtoll(line.c_str() + ts, &stop, 10);
      if (stop == line.c_str() + ts) return false;
      size_t rest = line.find_first_not_of(" \t", stop - line.c_str());
      if (rest != std::string::npos) return false;
    }
  }
  return true;
}

bool Matches(const Sample& s, const std::map<std::string, std::string>& match) {
  for (const auto& [k, v] : match) {
    auto it = s.labels.find(k);
    if (it == s.labels.end() || it->second != v) return false;
  }
  return true;
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Status ParseText(const std::string& text, ParsedText* out) {
  *out = ParsedText();
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    line = line.substr(first);
    if (line[0] == '#') {
      // "# HELP name text" / "# TYPE name type"; other comments are ignored.
      bool help = line.rfind("# HELP ", 0) == 0, type = line.rfind("# TYPE ", 0) == 0;
      if (!help && !type) continue;
      std::string rest = line.substr(7);
      size_t sp = rest.find(' ');
      std::string name = rest.substr(0, sp);
      std::string arg = sp == std::string::npos ? "" : rest.substr(sp + 1);
      if (name.empty()) return Status("malformed", "line " + std::to_string(line_no) + ": no name");
      if (help)
        out->help[name] = Unescape(arg);
      else
        out->types[name] = arg;
      continue;
    }
    Sample s;
    if (!ParseSample(line, &s))
      return Status("malformed", "line " + std::to_string(line_no) + ": \"" + line + "\"");
    out->samples.push_back(std::move(s));
  }
  return Status::Ok();
}

double SumSamples(const ParsedText& parsed, const std::string& name,
                  const std::map<std::string, std::string>& match) {
  double sum = 0;
  for (const Sample& s : parsed.samples)
    if (s.name == name && Matches(s, match)) sum += s.value;
  return sum;
}

std::map<double, double> HistogramBuckets(const ParsedText& parsed, const std::string& family,
                                          const std::map<std::string, std::string>& match) {
  std::map<double, double> out;
  const std::string bucket = family + "_bucket";
  for (const Sample& s : parsed.samples) {
    if (s.name != bucket || !Matches(s, match)) continue;
    auto le = s.labels.find("le");
    double bound;
    if (le == s.labels.end() || !ParseDouble(le->second, &bound)) continue;
    out[bound] += s.value;
  }
  return out;
}

double HistogramQuantile(double q, const std::map<double, double>& cumulative) {
  if (cumulative.empty()) return std::numeric_limits<double>::quiet_NaN();
  double total = cumulative.rbegin()->second;
  if (!(total > 0)) return std::numeric_limits<double>::quiet_NaN();
  double rank = q * total;
  double lower_bound = 0, lower_count = 0, largest_finite = 0;
  for (const auto& [bound, count] : cumulative) {
    if (std::isinf(bound)) {
      return largest_finite;  // in the +Inf bucket: the best we can say
    }
    if (count >= rank) {
      double in_bucket = count - lower_count;
      if (in_bucket <= 0) return bound;
      return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket;
    }
    lower_bound = bound;
    lower_count = count;
    largest_finite = bound;
  }
  return largest_finite;
}

}  // namespace ferry::metrics
