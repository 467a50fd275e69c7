// JobQueue: batches of one model in arrival order, drain after Close, blocking take.
#include <gtest/gtest.h>

#include <thread>

#include "job_queue.h"

namespace ferry::worker {
namespace {

Job J(const std::string& id, const std::string& model) {
  Job j;
  j.entry.id = id;
  j.entry.model = model;
  return j;
}

std::vector<std::string> Ids(const std::vector<Job>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.entry.id);
  return ids;
}

TEST(WorkerJobQueueTest, TakesUpToMaxBatchOfTheOldestJobsModel) {
  JobQueue q(100);
  std::vector<Job> jobs;
  for (auto [id, model] : std::vector<std::pair<std::string, std::string>>{
           {"a1", "a"}, {"b1", "b"}, {"a2", "a"}, {"a3", "a"}, {"b2", "b"}, {"a4", "a"}})
    jobs.push_back(J(id, model));
  EXPECT_TRUE(q.Push(std::move(jobs)));
  std::vector<Job> batch;
  ASSERT_TRUE(q.TakeBatch(3, &batch));
  EXPECT_EQ(Ids(batch), std::vector<std::string>({"a1", "a2", "a3"}));
  ASSERT_TRUE(q.TakeBatch(3, &batch));
  EXPECT_EQ(Ids(batch), std::vector<std::string>({"b1", "b2"}));
  ASSERT_TRUE(q.TakeBatch(3, &batch));
  EXPECT_EQ(Ids(batch), std::vector<std::string>({"a4"}));
  EXPECT_EQ(q.size(), 0u);
}

TEST(WorkerJobQueueTest, CloseDrainsWhatIsQueuedThenStops) {
  JobQueue q(1);
  std::vector<Job> jobs;
  jobs.push_back(J("x", "m"));
  jobs.push_back(J("y", "m"));
  EXPECT_FALSE(q.Push(std::move(jobs)));  // over capacity: queued anyway, reported
  q.Close();
  std::vector<Job> batch;
  ASSERT_TRUE(q.TakeBatch(8, &batch));
  EXPECT_EQ(batch.size(), 2u);
  EXPECT_FALSE(q.TakeBatch(8, &batch));
  EXPECT_TRUE(batch.empty());
}

TEST(WorkerJobQueueTest, TakeBlocksUntilAPushOrClose) {
  JobQueue q(10);
  std::vector<Job> got;
  std::thread taker([&] {
    std::vector<Job> batch;
    while (q.TakeBatch(4, &batch))
      for (auto& j : batch) got.push_back(std::move(j));
  });
  std::vector<Job> jobs;
  jobs.push_back(J("p", "m"));
  q.Push(std::move(jobs));
  q.Close();
  taker.join();
  EXPECT_EQ(Ids(got), std::vector<std::string>({"p"}));
}

}  // namespace
}  // namespace ferry::worker
