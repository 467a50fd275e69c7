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

// The ids a person follows a job by: LogFields on this thread (nested scopes add up, and end
// with their scope) and SetProcessField for every line.
TEST(LogJson, CarriesJobModelAndWorkerFields) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger logger("test", sink);
  logger.set_formatter(logging::MakeJsonFormatter("worker"));
  logging::SetProcessField("worker", "host:7:cpu");
  {
    logging::LogFields model({{"model", "tiny"}});
    {
      logging::LogFields job({{"job_id", "j-\"1\""}});
      logger.warn("job failed");
    }
    logger.warn("model only");
  }
  logger.warn("no scope");
  logging::SetProcessField("worker", "");  // removed: the other tests' lines do not carry it
  std::istringstream in(out.str());
  std::string line;
  std::vector<cli::JsonValue> v;
  while (std::getline(in, line)) {
    cli::JsonValue value;
    ASSERT_TRUE(cli::ParseJson(line, &value).ok()) << line;
    v.push_back(value);
  }
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0]["worker"].StringOr(""), "host:7:cpu");
  EXPECT_EQ(v[0]["model"].StringOr(""), "tiny");
  EXPECT_EQ(v[0]["job_id"].StringOr(""), "j-\"1\"");
  EXPECT_EQ(v[1]["model"].StringOr(""), "tiny");
  EXPECT_EQ(v[1]["job_id"].type, cli::JsonValue::Type::kNull);
  EXPECT_EQ(v[2]["model"].type, cli::JsonValue::Type::kNull);
  EXPECT_EQ(v[2]["worker"].StringOr(""), "host:7:cpu");
}

// Text mode: one line per event whatever the message holds (a model's traceback), spdlog's
// pattern otherwise unchanged.
TEST(LogText, OneLinePerEvent) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger logger("test", sink);
  logger.set_formatter(logging::MakeTextFormatter());
  logger.warn(
      "model tiny: job j1 failed: The following operation failed:\n  File \"x\", line "
      "1\r\n\tRuntimeError: shapes\x01 differ");
  logger.info("plain message");
  const std::string text = out.str();
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << text;
  EXPECT_NE(lines[0].find("[warning] model tiny: job j1 failed: The following operation "
                          "failed:\\n  File \"x\", line 1\\r\\n RuntimeError: shapes\\x01 "
                          "differ"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("[info] plain message"), std::string::npos) << lines[1];
}

TEST(LogText, ClipCutsOnACharacterAndSaysHowMuch) {
  EXPECT_EQ(logging::Clip("short", 10), "short");
  EXPECT_EQ(logging::Clip("0123456789abc", 10), "0123456789... (3 more bytes)");
  // "é" is two bytes: a cut inside it backs off to before it.
  EXPECT_EQ(logging::Clip("abcd\xc3\xa9"
                          "fg",
                          5),
            "abcd... (4 more bytes)");
}

}  // namespace
}  // namespace ferry
