// --log-json: the spdlog formatter writes one JSON object per line, with the message escaped so
// that any text (quotes, backslashes, newlines, control bytes, invalid UTF-8) still parses.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "ferry/runtime/logging.h"
#include "json.h"

namespace ferry {
namespace {

std::vector<cli::JsonValue> LogAndParse(const std::vector<std::string>& messages) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger logger("test", sink);
  logger.set_formatter(logging::MakeJsonFormatter("broker"));
  logger.set_level(spdlog::level::trace);
  for (const auto& m : messages) logger.warn("{}", m);
  logger.debug("job {} on {}", "j-1", "cuda:0");
  std::vector<cli::JsonValue> values;
  std::istringstream in(out.str());
  std::string line;
  while (std::getline(in, line)) {
    for (unsigned char ch : line) EXPECT_GE(ch, 0x20) << "raw control byte in: " << line;
    cli::JsonValue v;
    Status s = cli::ParseJson(line, &v);
    EXPECT_TRUE(s.ok()) << s.ToString() << ": " << line;
    values.push_back(v);
  }
  return values;
}

TEST(LogJson, OneObjectPerLineWithTheFields) {
  auto v = LogAndParse({"worker w1 joined on cuda:0"});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].type, cli::JsonValue::Type::kObject);
  EXPECT_EQ(v[0]["level"].StringOr(""), "warning");
  EXPECT_EQ(v[0]["component"].StringOr(""), "broker");
  EXPECT_EQ(v[0]["logger"].StringOr(""), "test");
  EXPECT_EQ(v[0]["msg"].StringOr(""), "worker w1 joined on cuda:0");
  EXPECT_GT(v[0]["pid"].NumberOr(0), 0);
  const std::string ts = v[0]["ts"].StringOr("");
  ASSERT_EQ(ts.size(), 27u) << ts;  // 2026-11-22T10:15:02.123456Z
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts.back(), 'Z');
  EXPECT_EQ(v[1]["level"].StringOr(""), "debug");
  EXPECT_EQ(v[1]["msg"].StringOr(""), "job j-1 on cuda:0");
}

TEST(LogJson, MessagesAreEscaped) {
  const std::vector<std::string> hard = {
      "quote \" and backslash \\ and slash /",
      "two\nlines\r\nand a\ttab",
      std::string("control \x01\x1f\x7f bytes and a NUL: ") + std::string(1, '\0') + "end",
      "utf-8: h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x9a\x80",
      "{\"looks\": \"like json\"}",
  };
  auto v = LogAndParse(hard);
  ASSERT_EQ(v.size(), hard.size() + 1);
  for (size_t i = 0; i < hard.size(); ++i) EXPECT_EQ(v[i]["msg"].StringOr("?"), hard[i]) << i;
}

TEST(LogJson, InvalidUtf8BecomesReplacementCharacters) {
  std::string escaped;
  logging::AppendJsonEscaped(
      "a\xff"
      "b\xc3",
      &escaped);
  EXPECT_EQ(escaped, "a\\ufffdb\\ufffd");
  escaped.clear();
  logging::AppendJsonEscaped("\xed\xa0\x80", &escaped);  // a UTF-16 surrogate: not UTF-8
  EXPECT_EQ(escaped, "\\ufffd\\ufffd\\ufffd");
}

TEST(LogJson, ConfigureRejectsUnknownLevels) {
  EXPECT_EQ(logging::Configure("loud", false, "x").code(), codes::kInvalidArgument);
  EXPECT_TRUE(logging::Configure("info", false, "x").ok());
}

}  // namespace
}  // namespace ferry
