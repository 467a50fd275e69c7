#pragma once
// The version every Ferry binary prints on --version: CMake's project version and, when built
// from a git checkout, `git describe --always --dirty` at build time.

#include <string>

namespace ferry::runtime {

// "0.1.0".
const char* ProjectVersion();
// "abc1234", "v0.1.0-3-gabc1234-dirty", or "" outside a git checkout.
const char* GitDescribe();
// "PROGRAM 0.1.0 (git abc1234)", or "PROGRAM 0.1.0" without git: what --version prints.
std::string VersionLine(const std::string& program);

}  // namespace ferry::runtime
