#pragma once
// FlagSet: the command-line parser every Ferry binary uses, so that all of them accept
// `--name value`, `--name=value`, repeatable flags, `--help` and `--version` the same way.

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::runtime {

class FlagSet {
 public:
  FlagSet(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  // The target keeps its value as the default (a string's shown with any Redis URL password as
  // ***). Pointers must outlive Parse. A Bool is set by --NAME alone, or --NAME=true|1|false|0.
  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);  // no value
  void Repeated(const std::string& name, std::vector<std::string>* target, const std::string& help);

  // Parses argv[1..]. Positional arguments go to positional(). On --help sets help_requested(),
  // on --version version_requested() (the first of them wins; the rest is not parsed).
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  bool version_requested() const { return version_; }
  // "PROGRAM 0.1.0 (git abc1234)", PROGRAM being the program's first word ("ferry submit" ->
  // "ferry"): what --version prints.
  std::string VersionLine() const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kBool, kRepeated };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
  };
  const Flag* Lookup(const std::string& name) const;

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
  bool version_ = false;
};

// Standard handling in a main(): prints usage on --help or the version line on --version
// (returns 0), or the error (returns 2); returns -1 when the program should go on.
int HandleFlagResult(const FlagSet& flags, const Status& parsed);

}  // namespace ferry::runtime
