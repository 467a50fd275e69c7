#include "json.h"

#include <cstdlib>

namespace ferry::cli {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool Document(JsonValue* out) {
    if (!Value(out, 0)) return false;
    Space();
    return i_ == s_.size();
  }
  size_t position() const { return i_; }

 private:
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool Literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }
  bool Value(JsonValue* out, int depth) {
    if (depth > 64) return false;
    Space();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->type = JsonValue::Type::kString;
      return String(&out->string);
    }
    if (Literal("true")) {
      out->type = JsonValue::Type::kBool;
      out->boolean = true;
      return true;
    }
    if (Literal("false")) {
      out->type = JsonValue::Type::kBool;
      return true;
    }
    if (Literal("null")) {
      out->type = JsonValue::Type::kNull;
      return true;
    }
    const char* start = s_.c_str() + i_;
    char* end = nullptr;
    out->number = std::strtod(start, &end);
    if (end == start) return false;
    out->type = JsonValue::Type::kNumber;
    i_ += static_cast<size_t>(end - start);
    return true;
  }
  bool Object(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kObject;
    ++i_;
    Space();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    while (true) {
      Space();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"' || !String(&key)) return false;
      Space();
      if (i_ >= s_.size() || s_[i_++] != ':') return false;
      if (!Value(&out->object[key], depth + 1)) return false;
      Space();
      if (i_ >= s_.size()) return false;
      char c = s_[i_++];
      if (c == '}') return true;
      if (c != ',') return false;
    }
  }
  bool Array(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kArray;
    ++i_;
    Space();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    while (true) {
      out->array.emplace_back();
      if (!Value(&out->array.back(), depth + 1)) return false;
      Space();
      if (i_ >= s_.size()) return false;
      char c = s_[i_++];
      if (c == ']') return true;
      if (c != ',') return false;
    }
  }
  void AppendUtf8(unsigned cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool String(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case 'n':
          *out += '\n';
          break;
        case 't':
          *out += '\t';
          break;
        case 'r':
          *out += '\r';
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          AppendUtf8(static_cast<unsigned>(std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16)),
                     out);
          i_ += 4;
          break;
        }
        default:
          *out += e;  // " \ /
      }
    }
    return false;
  }

  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

const JsonValue& JsonValue::operator[](const std::string& key) const {
  static const JsonValue kNull;
  if (type != Type::kObject) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : it->second;
}

Status ParseJson(const std::string& text, JsonValue* out) {
  *out = JsonValue();
  Parser p(text);
  if (!p.Document(out))
    return Status("malformed", "bad JSON near byte " + std::to_string(p.position()));
  return Status::Ok();
}

}  // namespace ferry::cli
