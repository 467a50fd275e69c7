#include "ferry/runtime/flags.h"

#include <cstdio>
#include <stdexcept>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/runtime/version.h"

namespace ferry::runtime {

void FlagSet::String(const std::string& name, std::string* target, const std::string& help) {
  // A default may come from the environment ($FERRY_REDIS): the usage text, printed on any bad
  // flag, never shows its password.
  flags_.push_back({name, Kind::kString, target, help, protocol::RedactRedisUrl(*target)});
}
void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help) {
  flags_.push_back({name, Kind::kInt, target, help, std::to_string(*target)});
}
void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, Kind::kBool, target, help, *target ? "true" : "false"});
}
void FlagSet::Repeated(const std::string& name, std::vector<std::string>* target,
                       const std::string& help) {
  flags_.push_back({name, Kind::kRepeated, target, help, ""});
}

const FlagSet::Flag* FlagSet::Lookup(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Status FlagSet::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      return Status::Ok();
    }
    if (arg == "--version") {
      version_ = true;
      return Status::Ok();
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* f = Lookup(name);
    if (!f) return Status::InvalidArgument("unknown flag --" + name);
    if (f->kind == Kind::kBool) {
      if (has_value && value != "true" && value != "1" && value != "false" && value != "0")
        return Status::InvalidArgument("flag --" + name + " wants true or false (or none), got \"" +
                                       value + "\"");
      *static_cast<bool*>(f->target) = !has_value || value == "true" || value == "1";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return Status::InvalidArgument("flag --" + name + " needs a value");
      value = argv[++i];
    }
    switch (f->kind) {
      case Kind::kString:
        *static_cast<std::string*>(f->target) = value;
        break;
      case Kind::kRepeated:
        static_cast<std::vector<std::string>*>(f->target)->push_back(value);
        break;
      case Kind::kInt:
        try {
          size_t used = 0;
          int64_t v = std::stoll(value, &used);
          if (used != value.size()) throw std::invalid_argument(value);
          *static_cast<int64_t*>(f->target) = v;
        } catch (...) {
          return Status::InvalidArgument("flag --" + name + " wants an integer, got \"" + value +
                                         "\"");
        }
        break;
      case Kind::kBool:
        break;
    }
  }
  return Status::Ok();
}

std::string FlagSet::Usage() const {
  std::string out = "usage: " + program_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name;
    if (f.kind != Kind::kBool) left += f.kind == Kind::kInt ? " N" : " VALUE";
    if (left.size() < 30)
      left.resize(30, ' ');
    else
      left += "\n" + std::string(30, ' ');
    out += left + f.help;
    if (f.kind == Kind::kRepeated)
      out += " (repeatable)";
    else if (!f.default_text.empty())
      out += " (default: " + f.default_text + ")";
    out += "\n";
  }
  out += "  --help                      print this help\n";
  out += "  --version                   print the version and exit\n";
  return out;
}

std::string FlagSet::VersionLine() const {
  return runtime::VersionLine(program_.substr(0, program_.find(' ')));
}

int HandleFlagResult(const FlagSet& flags, const Status& parsed) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n\n%s", parsed.message().c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (flags.version_requested()) {
    std::printf("%s\n", flags.VersionLine().c_str());
    return 0;
  }
  return -1;
}

}  // namespace ferry::runtime
