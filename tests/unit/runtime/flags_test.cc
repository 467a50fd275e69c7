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

// A bool takes no value, or true/1/false/0: anything else ("yes", "on") is an error, not a
// silent false (`--no-journal=yes` left the journal on).
TEST(Flags, BoolsTakeTrueOrFalseAndRefuseAnythingElse) {
  for (const auto& [arg, want] : std::vector<std::pair<std::string, bool>>{{"--fast", true},
                                                                           {"--fast=true", true},
                                                                           {"--fast=1", true},
                                                                           {"--fast=false", false},
                                                                           {"--fast=0", false}}) {
    bool b = !want;
    FlagSet f("prog", "test");
    f.Bool("fast", &b, "a bool");
    ASSERT_TRUE(ParseArgs(f, {arg}).ok()) << arg;
    EXPECT_EQ(b, want) << arg;
  }
  for (const std::string arg : {"--fast=yes", "--fast=on", "--fast=", "--fast=TRUE"}) {
    bool b = false;
    FlagSet f("prog", "test");
    f.Bool("fast", &b, "a bool");
    Status s = ParseArgs(f, {arg});
    EXPECT_EQ(s.code(), std::string(codes::kInvalidArgument)) << arg;
    EXPECT_NE(s.message().find("--fast wants true or false"), std::string::npos) << s.message();
  }
}

// A default from the environment ($FERRY_REDIS with a password) is shown in the usage text,
// which goes to stderr on any bad flag, without its password.
TEST(Flags, TheUsageTextNeverShowsARedisPassword) {
  std::string redis = "redis://app:s3cr3t@10.0.0.5:6379";
  std::string frontend = "tcp://127.0.0.1:5555";
  FlagSet f("prog", "test");
  f.String("redis", &redis, "Redis");
  f.String("frontend", &frontend, "the broker");
  EXPECT_EQ(f.Usage().find("s3cr3t"), std::string::npos) << f.Usage();
  EXPECT_NE(f.Usage().find("(default: redis://app:***@10.0.0.5:6379)"), std::string::npos)
      << f.Usage();
  EXPECT_NE(f.Usage().find("(default: tcp://127.0.0.1:5555)"), std::string::npos) << f.Usage();
  EXPECT_EQ(redis, "redis://app:s3cr3t@10.0.0.5:6379");  // the value itself is untouched
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
