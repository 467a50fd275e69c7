// Admission (broker/src/admission.h) against a real Scheduler: every outcome of Admit, the
// boundaries of each limit, and that the first failing check names the code.
#include "admission.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/broker/broker.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis_errors.h"
#include "scheduler.h"

namespace ferry::broker {
namespace {

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    buffer_.assign(4096, '\0');
    for (size_t i = 0; i < buffer_.size(); ++i) buffer_[i] = static_cast<char>(i & 0xff);
    options_.max_job_bytes = 100;
    options_.max_queue = 2;
    options_.max_pending_bytes = 1000;
    protocol::WorkerHello hello;
    hello.worker = "w1";
    hello.device = "cpu";
    hello.capacity = 8;
    hello.models = {{"m", 4}};
    scheduler_.AddWorker("w1", hello, 0);
  }

  // A job whose inputs are uint8 tensors of these sizes, pointing into buffer_.
  protocol::SubmitJob Submit(const std::string& id, const std::string& model,
                             std::vector<size_t> sizes = {10}) {
    protocol::SubmitJob in;
    in.id = id;
    in.model = model;
    size_t offset = 0;
    for (size_t n : sizes) {
      protocol::TensorRef t;
      t.dtype = DType::kUInt8;
      t.shape = {static_cast<int64_t>(n)};
      t.data = buffer_.data() + offset;
      t.size = n;
      offset += n;
      in.inputs.push_back(t);
    }
    return in;
  }

  // Queues an accepted job holding `raw_bytes` bytes of inputs (what pending_bytes counts).
  void Queue(const std::string& id, const std::string& model, size_t raw_bytes = 1) {
    auto job = std::make_unique<Job>();
    job->id = id;
    job->model = model;
    job->inputs_raw.assign(raw_bytes, 'x');
    ASSERT_TRUE(scheduler_.Add(std::move(job)).ok()) << id;
  }

  Status AdmitJob(const protocol::SubmitJob& in) { return Admit(in, scheduler_, options_); }

  std::string buffer_;
  Scheduler scheduler_;
  BrokerOptions options_;
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(AdmissionTest, AJobWithinEveryLimitIsAdmitted) {
  Status s = AdmitJob(Submit("a", "m", {10, 20}));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(AdmissionTest, AModelNoWorkerAnnouncedIsUnknown) {
  Status s = AdmitJob(Submit("a", "resnet50"));
  EXPECT_EQ(s.code(), codes::kUnknownModel) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "\"resnet50\"")) << s.message();
  EXPECT_FALSE(s.retryable());
}

TEST_F(AdmissionTest, AModelRestoredFromTheJournalIsKnownWithoutAWorker) {
  ASSERT_EQ(AdmitJob(Submit("a", "bert")).code(), codes::kUnknownModel);
  scheduler_.AddKnownModel("bert");
  Status s = AdmitJob(Submit("a", "bert"));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(AdmissionTest, InputsOverMaxJobBytesAreTooLarge) {
  // The limit counts the tensor bytes of all inputs together.
  Status s = AdmitJob(Submit("a", "m", {60, 41}));
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "101 bytes")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "limit is 100")) << s.message();
  EXPECT_FALSE(s.retryable());
}

TEST_F(AdmissionTest, InputsExactlyAtMaxJobBytesAreAdmitted) {
  Status s = AdmitJob(Submit("a", "m", {60, 40}));
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = AdmitJob(Submit("b", "m", {100}));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// With the journal on, the inputs that travel through the broker are journaled with their bytes,
// and Redis refuses a value over 512 MiB: such a job is too_large whatever --max-job-bytes says.
// Stored inputs (the journal names them only) and --no-journal are not limited by it.
TEST_F(AdmissionTest, InputsTooBigToJournalAreTooLargeUnlessStoredOrNotJournaled) {
  options_.max_job_bytes = int64_t{1} << 40;
  options_.max_pending_bytes = int64_t{1} << 40;
  protocol::SubmitJob big = Submit("big", "m", {10});
  big.inputs[0].shape = {static_cast<int64_t>(protocol::kMaxValueDataBytes) + 1};
  big.inputs[0].size = protocol::kMaxValueDataBytes + 1;  // never read: admission looks at sizes
  Status s = AdmitJob(big);
  EXPECT_EQ(s.code(), codes::kTooLarge) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "--no-journal")) << s.message();
  big.inputs[0].stored = true;
  EXPECT_TRUE(AdmitJob(big).ok());
  big.inputs[0].stored = false;
  options_.journal = false;
  EXPECT_TRUE(AdmitJob(big).ok());
}

TEST_F(AdmissionTest, AnIdAlreadyPendingIsADuplicate) {
  Queue("a", "m");
  Status s = AdmitJob(Submit("a", "m"));
  EXPECT_EQ(s.code(), codes::kDuplicate) << s.ToString();
  // Dispatched is still pending.
  Chunk chunk;
  ASSERT_TRUE(scheduler_.NextChunk(&chunk));
  EXPECT_EQ(AdmitJob(Submit("a", "m")).code(), codes::kDuplicate);
  // Once it is finished the id may be used again.
  std::vector<std::string> not_held;
  ASSERT_EQ(scheduler_.Complete("w1", {"a"}, &not_held).size(), 1u);
  s = AdmitJob(Submit("a", "m"));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(AdmissionTest, AModelQueueAtMaxQueueIsFull) {
  Queue("q1", "m");
  Status s = AdmitJob(Submit("a", "m"));
  EXPECT_TRUE(s.ok()) << "one below max_queue: " << s.ToString();
  Queue("q2", "m");
  s = AdmitJob(Submit("a", "m"));
  EXPECT_EQ(s.code(), codes::kQueueFull) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "\"m\"")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "holds 2 jobs")) << s.message();
  EXPECT_TRUE(s.retryable());
}

TEST_F(AdmissionTest, MaxQueueIsPerModelAndCountsQueuedJobsOnly) {
  scheduler_.AddKnownModel("other");
  Queue("q1", "m");
  Queue("q2", "m");
  ASSERT_EQ(AdmitJob(Submit("a", "m")).code(), codes::kQueueFull);
  // Another model's queue is not m's.
  Status s = AdmitJob(Submit("a", "other"));
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Jobs dispatched to a worker leave the queue.
  Chunk chunk;
  ASSERT_TRUE(scheduler_.NextChunk(&chunk));
  ASSERT_EQ(scheduler_.QueueDepth("m"), 0u);
  s = AdmitJob(Submit("a", "m"));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(AdmissionTest, PendingBytesOverMaxPendingBytesAreQueueFull) {
  options_.max_queue = 100;
  Queue("q1", "m", 970);
  // 970 pending + 30 = 1000: exactly at the limit.
  Status s = AdmitJob(Submit("a", "m", {30}));
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = AdmitJob(Submit("a", "m", {31}));
  EXPECT_EQ(s.code(), codes::kQueueFull) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "pending input bytes (1000)")) << s.message();
  EXPECT_TRUE(s.retryable());
  // Dispatched jobs still hold their bytes until they finish.
  Chunk chunk;
  ASSERT_TRUE(scheduler_.NextChunk(&chunk));
  EXPECT_EQ(AdmitJob(Submit("a", "m", {31})).code(), codes::kQueueFull);
  std::vector<std::string> not_held;
  ASSERT_EQ(scheduler_.Complete("w1", {"q1"}, &not_held).size(), 1u);
  s = AdmitJob(Submit("a", "m", {31}));
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// Several checks fail at once: the earliest in the documented order names the code.
// ---- input specs (READY "inputs") ----

protocol::InputSpec Spec(DType dtype, std::vector<int64_t> shape, std::string name = "") {
  protocol::InputSpec s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.shape = std::move(shape);
  return s;
}

protocol::WorkerHello HelloWith(const std::string& worker, const std::string& model,
                                std::optional<std::vector<protocol::InputSpec>> inputs) {
  protocol::WorkerHello h;
  h.worker = worker;
  h.device = "cpu";
  h.capacity = 8;
  h.models = {{model, 4, std::move(inputs)}};
  return h;
}

// A job of `model` whose inputs have these dtypes and shapes (no bytes: only the form is read).
protocol::SubmitJob Shaped(const std::string& model,
                           std::vector<std::pair<DType, std::vector<int64_t>>> inputs,
                           bool stored = false) {
  protocol::SubmitJob in;
  in.id = "j";
  in.model = model;
  for (auto& [dtype, shape] : inputs) {
    protocol::TensorRef t;
    t.dtype = dtype;
    t.shape = shape;
    t.stored = stored;
    in.inputs.push_back(t);
  }
  return in;
}

TEST_F(AdmissionTest, JobsAreCheckedAgainstTheAnnouncedInputSpec) {
  scheduler_.AddWorker(
      "w2",
      HelloWith("w2", "asr",
                std::vector<protocol::InputSpec>{Spec(DType::kFloat32, {-1, 80}, "mel"),
                                                 Spec(DType::kInt64, {}, "lengths")}),
      0);
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kFloat32, {0, 80}}, {DType::kInt64, {}}})).ok());
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kFloat32, {3000, 80}}, {DType::kInt64, {}}})).ok());

  Status s = AdmitJob(Shaped("asr", {{DType::kFloat16, {100, 80}}, {DType::kInt64, {}}}));
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "model \"asr\" input 0 (\"mel\"): expected float32 [-1, 80], got float16 [100, 80]");
  s = AdmitJob(Shaped("asr", {{DType::kFloat32, {100, 81}}, {DType::kInt64, {}}}));
  EXPECT_EQ(s.message(),
            "model \"asr\" input 0 (\"mel\"): expected float32 [-1, 80], got float32 [100, 81]");
  s = AdmitJob(Shaped("asr", {{DType::kFloat32, {100, 80}}, {DType::kInt64, {1}}}));
  EXPECT_EQ(s.message(), "model \"asr\" input 1 (\"lengths\"): expected int64 [], got int64 [1]");
  s = AdmitJob(Shaped("asr", {{DType::kFloat32, {80}}, {DType::kInt64, {}}}));  // rank
  EXPECT_TRUE(Contains(s.message(), "expected float32 [-1, 80], got float32 [80]")) << s.message();
  s = AdmitJob(Shaped("asr", {{DType::kFloat32, {100, 80}}}));
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "model \"asr\" takes 2 input(s) (input 0 (\"mel\"): float32 [-1, 80], input 1 "
            "(\"lengths\"): int64 []), got 1");
  // Stored (claim-check) inputs carry their dtype and shape in the job: checked the same way.
  EXPECT_TRUE(
      AdmitJob(Shaped("asr", {{DType::kFloat32, {7, 80}}, {DType::kInt64, {}}}, true)).ok());
  s = AdmitJob(Shaped("asr", {{DType::kInt16, {7, 80}}, {DType::kInt64, {}}}, true));
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "got int16 [7, 80]")) << s.message();
}

TEST_F(AdmissionTest, AModelWithoutASpecTakesAnyInputs) {
  // SetUp's worker announces "m" without "inputs": today's behaviour.
  EXPECT_TRUE(AdmitJob(Shaped("m", {{DType::kBool, {1, 2, 3}}, {DType::kInt8, {}}})).ok());
  // One worker serving a model without a spec makes it unchecked, whatever the others declare.
  scheduler_.AddWorker(
      "w2", HelloWith("w2", "m", std::vector<protocol::InputSpec>{Spec(DType::kUInt8, {4})}), 0);
  EXPECT_TRUE(AdmitJob(Shaped("m", {{DType::kBool, {1}}})).ok());
  scheduler_.RemoveWorker("w1");
  EXPECT_EQ(AdmitJob(Shaped("m", {{DType::kBool, {1}}})).code(), codes::kInvalidArgument);
}

TEST_F(AdmissionTest, DuringARollingUpgradeAJobMatchingAnyWorkersSpecIsAdmitted) {
  scheduler_.AddWorker(
      "old", HelloWith("old", "asr", std::vector<protocol::InputSpec>{Spec(DType::kInt16, {-1})}),
      0);
  scheduler_.AddWorker(
      "new", HelloWith("new", "asr", std::vector<protocol::InputSpec>{Spec(DType::kFloat32, {-1})}),
      0);
  ASSERT_EQ(scheduler_.SpecsOf("asr")->size(), 2u);
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kInt16, {16000}}})).ok());
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kFloat32, {16000}}})).ok());
  Status s = AdmitJob(Shaped("asr", {{DType::kUInt8, {16000}}}));
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  // The message is about the latest announcer's spec, and says there are two.
  EXPECT_TRUE(Contains(s.message(), "expected float32 [-1], got uint8 [16000]")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "2 different input specs")) << s.message();
  // The old generation leaves: only the new spec is left.
  scheduler_.RemoveWorker("old");
  EXPECT_EQ(AdmitJob(Shaped("asr", {{DType::kInt16, {16000}}})).code(), codes::kInvalidArgument);
  // The last worker leaves: its spec is kept (jobs queued until a worker is back are checked).
  scheduler_.RemoveWorker("new");
  EXPECT_EQ(AdmitJob(Shaped("asr", {{DType::kInt16, {16000}}})).code(), codes::kInvalidArgument);
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kFloat32, {16000}}})).ok());
  // A worker re-announcing the model with another spec replaces it.
  scheduler_.AddWorker(
      "back", HelloWith("back", "asr", std::vector<protocol::InputSpec>{Spec(DType::kInt16, {-1})}),
      0);
  EXPECT_TRUE(AdmitJob(Shaped("asr", {{DType::kInt16, {16000}}})).ok());
  EXPECT_EQ(AdmitJob(Shaped("asr", {{DType::kFloat32, {1}}})).code(), codes::kInvalidArgument);
}

TEST_F(AdmissionTest, UnknownModelComesBeforeTheSpecAndTheSpecBeforeTooLarge) {
  scheduler_.AddWorker(
      "w2", HelloWith("w2", "s", std::vector<protocol::InputSpec>{Spec(DType::kUInt8, {4})}), 0);
  EXPECT_EQ(AdmitJob(Shaped("nope", {{DType::kFloat32, {1}}})).code(), codes::kUnknownModel);
  protocol::SubmitJob big = Submit("b", "s", {500});  // uint8 [500]: the wrong shape, too large
  EXPECT_EQ(AdmitJob(big).code(), codes::kInvalidArgument);
}

TEST_F(AdmissionTest, UnknownModelComesBeforeTooLarge) {
  EXPECT_EQ(AdmitJob(Submit("a", "nope", {101})).code(), codes::kUnknownModel);
}

// A pending id is a duplicate whatever else is wrong with the job, so any other rejection tells
// the producer the id is not pending: the job's stored inputs are its own to delete (a
// duplicate's keys are the pending job's).
TEST_F(AdmissionTest, DuplicateComesBeforeEveryOtherCheck) {
  options_.max_pending_bytes = 0;
  Queue("a", "m");
  Queue("b", "m");
  EXPECT_EQ(AdmitJob(Submit("a", "m", {101})).code(), codes::kDuplicate);  // too large too
  EXPECT_EQ(AdmitJob(Submit("a", "nope")).code(), codes::kDuplicate);      // unknown model too
  EXPECT_EQ(AdmitJob(Submit("c", "m", {101})).code(), codes::kTooLarge);
}

TEST_F(AdmissionTest, DuplicateComesBeforeQueueLimits) {
  options_.max_pending_bytes = 0;
  Queue("a", "m");
  Queue("b", "m");
  EXPECT_EQ(AdmitJob(Submit("a", "m")).code(), codes::kDuplicate);
}

TEST_F(AdmissionTest, TheQueueLimitComesBeforeThePendingBytesLimit) {
  options_.max_pending_bytes = 0;
  Queue("q1", "m");
  Queue("q2", "m");
  Status s = AdmitJob(Submit("a", "m"));
  EXPECT_EQ(s.code(), codes::kQueueFull);
  EXPECT_TRUE(Contains(s.message(), "queue of model \"m\"")) << s.message();
}

}  // namespace
}  // namespace ferry::broker
