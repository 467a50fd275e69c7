#include "ferry/runtime/version.h"

#ifndef FERRY_PROJECT_VERSION
#define FERRY_PROJECT_VERSION "unknown"
#endif

namespace ferry::runtime {

extern const char kGitDescribe[];  // build/runtime/git_version.cc (cmake/git_version.cmake)

const char* ProjectVersion() { return FERRY_PROJECT_VERSION; }
const char* GitDescribe() { return kGitDescribe; }

std::string VersionLine(const std::string& program) {
  std::string line = program + " " + ProjectVersion();
  if (kGitDescribe[0] != '\0') line += std::string(" (git ") + kGitDescribe + ")";
  return line;
}

}  // namespace ferry::runtime
