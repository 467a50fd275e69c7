// Executor's thread loop with a real ResultWriter against a real redis-server: a batch that
// throws something unexpected fails its jobs with internal, and their results are written like
// any other -- with the job's result notice on its "notify" channel, its attempt and timings.
// And a job whose deadline passes while its model loads does not run.
#include "executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/result.h"
#include "job_queue.h"
#include "model_registry.h"
#include "outbox.h"
#include "process.h"  // testutil: RedisServer, WaitFor, NextPubSubMessage
#include "result_writer.h"
#include "test_models.h"

namespace ferry::worker {
namespace {

// The internal-error path: the residency listener throws when the lazy load of the batch's
// model announces it, so the exception leaves RunBatch (the registry is left consistent: the
// model is resident, with no lease).
TEST(ExecutorTest, JobsOfABatchThatThrowsAreFailedWithTheirNoticeAttemptAndTimings) {
  testutil::RedisServer redis;
  std::unique_ptr<protocol::RedisClient> client = redis.Connect();
  ASSERT_NE(client, nullptr);
  const std::string channel = "ferry:notify:executor-test";
  std::unique_ptr<protocol::RedisSubscriber> sub;
  ASSERT_TRUE(protocol::RedisSubscriber::Connect(redis.endpoint(), 2000, channel, &sub).ok());

  Outbox outbox(1024);
  ASSERT_TRUE(outbox.Init().ok());
  ResultWriter::Options wo;
  wo.redis = redis.endpoint();
  wo.worker_name = "test-worker";
  ResultWriter writer(wo, &outbox);
  writer.Start();

  ModelConfig config;
  config.name = "double";
  config.path = testmodels::Path("double");
  config.device = "cpu";
  config.max_batch = 4;
  ModelRegistry registry(ModelRegistry::Options{}, {config});
  registry.SetListener([] { throw std::runtime_error("the listener failed"); });
  JobQueue queue(16);
  Executor executor(Executor::Options{}, &registry, &queue, &writer);
  executor.Start();
  struct CloseOnExit {  // so that a failed ASSERT does not leave the executor waiting for work
    JobQueue* queue;
    ~CloseOnExit() { queue->Close(); }
  } close_on_exit{&queue};

  std::vector<Job> jobs;
  jobs.push_back(testmodels::MakeJob("x1", "double", {testmodels::Ramp({2}, 1)}));
  jobs.back().entry.notify = channel;
  jobs.back().entry.attempt = 2;
  jobs.back().entry.submitted_us = 111;
  jobs.back().entry.dispatched_us = 222;
  jobs.back().received_us = 333;
  queue.Push(std::move(jobs));

  std::string payload;
  ASSERT_TRUE(testutil::NextPubSubMessage(sub.get(), &payload)) << "no notice";
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(payload.data(), payload.size(), &oh).ok());
  std::vector<std::string> ids;
  ASSERT_TRUE(protocol::GetStringArray(oh.get(), "ids", &ids).ok());
  EXPECT_EQ(ids, std::vector<std::string>{"x1"});

  queue.Close();
  executor.Join();
  writer.Stop();
  std::vector<DoneReport> reports;
  bool ready = false;
  outbox.TakeAll(&reports, &ready);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].notified, std::vector<std::string>{"x1"});

  std::string value;
  bool found = false;
  const protocol::Keys keys{std::string(protocol::kDefaultPrefix)};
  ASSERT_TRUE(client->Get(keys.Result("x1"), &value, &found).ok());
  ASSERT_TRUE(found);
  Result r;
  ASSERT_TRUE(protocol::DecodeResult(value.data(), value.size(), &r).ok());
  EXPECT_EQ(r.state, JobState::kFailed);
  EXPECT_EQ(r.error.code(), codes::kInternal);
  EXPECT_NE(r.error.message().find("the listener failed"), std::string::npos);
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.timing_us["submitted"], 111);
  EXPECT_EQ(r.timing_us["dispatched"], 222);
  EXPECT_EQ(r.timing_us["received"], 333);
}

// A lazy load that takes long (here the residency listener, called as the load announces the
// model, holds it 500 ms): a job whose deadline passed meanwhile ends `expired` without
// reaching the device, as one whose deadline passed in the queue does; the job without a
// deadline runs.
TEST(ExecutorTest, AJobWhoseDeadlinePassesWhileItsModelLoadsExpires) {
  ModelConfig config;
  config.name = "double";
  config.path = testmodels::Path("double");
  config.device = "cpu";
  ModelRegistry registry(ModelRegistry::Options{}, {config});
  registry.SetListener([] { std::this_thread::sleep_for(std::chrono::milliseconds(500)); });
  Executor executor(Executor::Options{}, &registry, nullptr, nullptr);
  std::vector<Job> jobs;
  jobs.push_back(testmodels::MakeJob("late", "double", {testmodels::Ramp({2}, 1)}));
  jobs.back().entry.deadline_us = protocol::NowMicros() + 100000;  // 100 ms: during the load
  jobs.push_back(testmodels::MakeJob("whenever", "double", {testmodels::Ramp({2}, 1)}));
  std::vector<JobResult> results = executor.RunBatch(std::move(jobs));
  ASSERT_EQ(results.size(), 2u);
  for (const JobResult& r : results) {
    if (r.job.entry.id == "late") {
      EXPECT_EQ(r.status.code(), codes::kExpired) << r.status.ToString();
    } else {
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }
  EXPECT_EQ(executor.batcher().forward_calls(), 1);
}

}  // namespace
}  // namespace ferry::worker
