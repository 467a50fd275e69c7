#include "ferry/runtime/flags.h"

#include "ferry/runtime/version.h"

#include <gtest/gtest.h>

namespace ferry::runtime {
namespace {

Status ParseArgs(FlagSet& f, std::vector<std::string> args) {
  std::vector<char*> argv = {const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  return f.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(Flags, ParsesAllKinds) {
  std::string s = "default";
  int64_t n = 3;
  bool b = false;
  std::vector<std::string> r;
  FlagSet f("prog", "test");
  f.String("name", &s, "a string");
  f.Int("count", &n, "an int");
  f.Bool("fast", &b, "a bool");
  f.Repeated("model", &r, "repeated");
  ASSERT_TRUE(
      ParseArgs(f, {"--name", "x", "--count=7", "--fast", "--model", "a=1", "--model=b=2", "pos"})
          .ok());
  EXPECT_EQ(s, "x");
  EXPECT_EQ(n, 7);
  EXPECT_TRUE(b);
  EXPECT_EQ(r, (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(f.positional(), (std::vector<std::string>{"pos"}));
  EXPECT_NE(f.Usage().find("--count N"), std::string::npos);
  EXPECT_NE(f.Usage().find("(default: 3)"), std::string::npos);
}

TEST(Flags, RejectsUnknownAndBadValues) {
  int64_t n = 0;
  FlagSet f("prog", "test");
  f.Int("count", &n, "an int");
  EXPECT_FALSE(ParseArgs(f, {"--nope"}).ok());
  FlagSet g("prog", "test");
  g.Int("count", &n, "an int");
  EXPECT_FALSE(ParseArgs(g, {"--count", "12x"}).ok());
  FlagSet h("prog", "test");
  h.Int("count", &n, "an int");
  EXPECT_FALSE(ParseArgs(h, {"--count"}).ok());
}

TEST(Flags, VersionStopsParsingAndNamesTheProgram) {
  int64_t n = 0;
  FlagSet f("ferry submit", "test");
  f.Int("count", &n, "an int");
  // --version wins over what follows, even a flag that would fail.
  ASSERT_TRUE(ParseArgs(f, {"--version", "--nope"}).ok());
  EXPECT_TRUE(f.version_requested());
  EXPECT_FALSE(f.help_requested());
  // "ferry submit" -> "ferry 0.1.0 (git ...)": the binary's name and CMake's project version.
  const std::string line = f.VersionLine();
  EXPECT_EQ(line.rfind(std::string("ferry ") + ProjectVersion(), 0), 0u) << line;
  if (GitDescribe()[0] != '\0')
    EXPECT_NE(line.find(std::string(" (git ") + GitDescribe() + ")"), std::string::npos) << line;
  EXPECT_NE(f.Usage().find("--version"), std::string::npos);
  EXPECT_EQ(HandleFlagResult(f, Status::Ok()), 0);
}

}  // namespace
}  // namespace ferry::runtime
