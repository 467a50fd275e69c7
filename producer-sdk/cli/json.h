#pragma once
// A minimal JSON reader for the CLI: enough to read the broker's STATS (Client::Stats) -- objects,
// arrays, strings, numbers, true/false/null. Not a general-purpose library.

#include <map>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::cli {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  // Member lookup on an object; a null value when absent or not an object.
  const JsonValue& operator[](const std::string& key) const;
  double NumberOr(double fallback) const { return type == Type::kNumber ? number : fallback; }
  std::string StringOr(const std::string& fallback) const {
    return type == Type::kString ? string : fallback;
  }
};

// Parses one JSON document (trailing whitespace allowed). Fails with malformed.
Status ParseJson(const std::string& text, JsonValue* out);

}  // namespace ferry::cli
