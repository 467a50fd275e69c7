// The `ferry` CLI's pieces that need no broker: argument handling, exit codes, result printing.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "commands.h"
#include "result_printer.h"

namespace ferry::cli {
namespace {

int RunFerry(std::vector<std::string> args) {
  args.insert(args.begin(), "ferry");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return RunCli(static_cast<int>(argv.size()), argv.data());
}

TEST(ClientCliTest, UsageAndExitCodes) {
  EXPECT_EQ(RunFerry({"--help"}), kExitOk);
  EXPECT_EQ(RunFerry({}), kExitUsage);
  EXPECT_EQ(RunFerry({"frobnicate"}), kExitUsage);
  EXPECT_EQ(RunFerry({"submit", "--help"}), kExitOk);
  EXPECT_EQ(RunFerry({"--redis", "redis://x:1", "get", "--help"}), kExitOk);
  EXPECT_EQ(RunFerry({"submit", "--model", "m"}), kExitUsage) << "no --input";
  EXPECT_EQ(RunFerry({"submit", "--model", "m", "--input", "/no/such/file"}), kExitUsage);
  EXPECT_EQ(RunFerry({"get"}), kExitUsage) << "no id";
  EXPECT_EQ(RunFerry({"get", "a", "b"}), kExitUsage);
  EXPECT_EQ(RunFerry({"wait", "x", "--bogus-flag"}), kExitUsage);
  EXPECT_EQ(RunFerry({"stats", "--request-timeout-ms", "ten"}), kExitUsage);
  EXPECT_EQ(RunFerry({"get", "job-1", "--redis", "redis://127.0.0.1:1"}), kExitUnavailable);
}

TEST(ClientCliTest, FormatsDoneAndFailedResults) {
  Result r;
  r.id = "job-1";
  r.state = JobState::kDone;
  r.model = "double";
  r.worker = "w";
  r.batch_size = 3;
  r.attempt = 1;
  r.timing_us = {{"submitted", 100}, {"compute_end", 400}, {"dispatched", 150}};
  r.outputs.push_back(Tensor::From<uint16_t>({0x3C00, 0xC000}, {2}, DType::kFloat16));  // 1, -2
  r.outputs.push_back(Tensor::From<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {10}, DType::kInt32));
  std::string text = FormatResult(r, 8);
  EXPECT_NE(text.find("status:      done"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_size:  3"), std::string::npos) << text;
  EXPECT_NE(text.find("submitted=+0 dispatched=+50 compute_end=+300"), std::string::npos) << text;
  EXPECT_NE(text.find("float16 [2] [1, -2]"), std::string::npos) << text;
  EXPECT_NE(text.find("[1, 2, 3, 4, 5, 6, 7, 8, ... (10 values)]"), std::string::npos) << text;

  r.state = JobState::kFailed;
  r.outputs.clear();
  r.error = Status(codes::kModelError, "boom");
  text = FormatResult(r);
  EXPECT_NE(text.find("status:      failed"), std::string::npos) << text;
  EXPECT_NE(text.find("error:       model_error: boom"), std::string::npos) << text;
}

}  // namespace
}  // namespace ferry::cli
