// The SDK's own checks of a job before anything of it is sent (producer-sdk/src/job_check.h):
// which limit a job over the broker's limits is refused for, and what the refusal says.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/status.h"
#include "job_check.h"  // producer-sdk/src

namespace ferry::client {
namespace {

// A job of one float32 input of `floats` elements.
Job FloatJob(const std::string& id, size_t floats) {
  Job j;
  j.id = id;
  j.model = "m";
  j.inputs.push_back(Tensor::From<float>(std::vector<float>(floats, 1.0f),
                                         {static_cast<int64_t>(floats)}, DType::kFloat32));
  return j;
}

ClientOptions Options(int64_t max_message_bytes, int64_t stored_input_bytes) {
  ClientOptions o;
  o.max_message_bytes = max_message_bytes;
  o.stored_input_bytes = stored_input_bytes;
  return o;
}

TEST(JobCheckTest, AJobWithinBothLimitsPasses) {
  const Job j = FloatJob("ok", 1000);  // 4,000 bytes
  EXPECT_TRUE(CheckJob(j, j.id, Options(64 << 10, 0), 8000).ok());
  EXPECT_TRUE(CheckJob(j, j.id, Options(64 << 10, 0), 0).ok());  // job limit not known yet
}

TEST(JobCheckTest, AJobOverTheMessageLimitIsToldToStoreItsInputs) {
  const Job j = FloatJob("big-message", 100000);  // 400,000 bytes inside the SUBMIT
  const Status s = CheckJob(j, j.id, Options(64 << 10, 0), 0);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("job \"big-message\" needs up to"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("store its big inputs in Redis"), std::string::npos) << s.message();
  // Stored, the same job fits the message.
  EXPECT_TRUE(CheckJob(j, j.id, Options(64 << 10, 1 << 16), 0).ok());
}

TEST(JobCheckTest, AJobOverBothLimitsIsRefusedForTheJobLimit) {
  // Storing its inputs cannot make it fit --max-job-bytes, so that advice would mislead.
  const Job j = FloatJob("over-both", 100000);  // 400,000 bytes
  const Status s = CheckJob(j, j.id, Options(64 << 10, 0), 200000);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_NE(s.message().find("job \"over-both\" has 400000 bytes of inputs; the broker takes at "
                             "most 200000 a job (its --max-job-bytes): not sent"),
            std::string::npos)
      << s.message();
  // Stored inputs count against the job limit too.
  EXPECT_EQ(CheckJob(j, j.id, Options(64 << 10, 1 << 16), 200000).code(), codes::kTooLarge);
}

}  // namespace
}  // namespace ferry::client
