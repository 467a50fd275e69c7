// OrphanWatch (orphan_watch.h): which models' queued jobs fail after --orphan-timeout-s without a
// worker, looked at against a real Scheduler, with the clock given.
#include "orphan_watch.h"

#include <gtest/gtest.h>

namespace ferry::broker {
namespace {

constexpr int64_t kSecond = 1000000;

std::unique_ptr<Job> MakeJob(const std::string& id, const std::string& model) {
  auto j = std::make_unique<Job>();
  j->id = id;
  j->model = model;
  return j;
}

std::vector<std::string> Models(const std::vector<OrphanWatch::Expired>& expired) {
  std::vector<std::string> out;
  for (const auto& e : expired) out.push_back(e.model);
  return out;
}

// A restarted broker's parked jobs wait for the worker that ran them, not for any worker: a
// model whose only waiting jobs are parked has nothing for the timeout to fail. Its queued jobs
// do fail, once it has had no worker for the timeout.
TEST(OrphanWatch, TheTimeoutFailsQueuedJobsAndLeavesParkedOnesBe) {
  OrphanWatch watch(/*timeout_s=*/1, /*start_us=*/0, /*heartbeat_ms=*/1, /*liveness=*/1);
  Scheduler s;
  s.AddKnownModel("m");  // as restored from the journal: announced before the restart
  ASSERT_TRUE(s.Add(MakeJob("parked", "m"), /*parked=*/true).ok());
  EXPECT_TRUE(watch.Check(s, 2 * kSecond).empty()) << "only a parked job waits";
  EXPECT_EQ(watch.orphaned().count("m"), 1u) << "yet the model has no worker";

  ASSERT_TRUE(s.Add(MakeJob("queued", "m")).ok());
  EXPECT_TRUE(watch.Check(s, 2 * kSecond + kSecond / 2).empty()) << "at most one look a second";
  const auto expired = watch.Check(s, 3 * kSecond);
  EXPECT_EQ(Models(expired), std::vector<std::string>{"m"});
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_NE(expired[0].message.find("no worker for model m since 1970-01-01T00:00:00Z"),
            std::string::npos)
      << expired[0].message;
}

// A model that a registered worker serves is never orphaned, whatever waits for it.
TEST(OrphanWatch, AServedModelIsNotOrphaned) {
  OrphanWatch watch(/*timeout_s=*/1, /*start_us=*/0, /*heartbeat_ms=*/1, /*liveness=*/1);
  Scheduler s;
  protocol::WorkerHello hello;
  hello.worker = "w";
  hello.capacity = 1;
  hello.models = {{"m", 1}};
  s.AddWorker("w", hello, 0);
  s.AddKnownModel("other");  // its worker left
  ASSERT_TRUE(s.Add(MakeJob("queued", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("queued-other", "other")).ok());
  EXPECT_EQ(Models(watch.Check(s, 5 * kSecond)), std::vector<std::string>{"other"});
  EXPECT_EQ(watch.orphaned().count("m"), 0u);
}

}  // namespace
}  // namespace ferry::broker
