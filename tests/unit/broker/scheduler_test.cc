// The broker's queue and dispatch logic, without sockets.
#include "ferry/broker/scheduler.h"

#include <gtest/gtest.h>

namespace ferry::broker {
namespace {

std::unique_ptr<Job> MakeJob(const std::string& id, const std::string& model, int64_t prio = 0) {
  auto j = std::make_unique<Job>();
  j->id = id;
  j->model = model;
  j->priority = prio;
  return j;
}

protocol::WorkerHello Hello(const std::string& name, int64_t capacity,
                            std::vector<protocol::ModelInfo> models) {
  protocol::WorkerHello h;
  h.worker = name;
  h.device = "cpu";
  h.capacity = capacity;
  h.models = std::move(models);
  return h;
}

std::vector<std::string> Ids(const Chunk& c) {
  std::vector<std::string> out;
  for (const Job* j : c.jobs) out.push_back(j->id);
  return out;
}

TEST(Scheduler, NoChunkWithoutWorkers) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  Chunk c;
  EXPECT_FALSE(s.NextChunk(&c));
  EXPECT_EQ(s.QueueDepth("m"), 1u);
}

TEST(Scheduler, RejectsDuplicatePendingIds) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  EXPECT_EQ(s.Add(MakeJob("a", "m")).code(), codes::kDuplicate);
}

TEST(Scheduler, ChunksRespectMaxBatchAndCredit) {
  Scheduler s;
  s.AddWorker("w1", Hello("w1", 6, {{"m", 4}}), 0);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.Add(MakeJob("j" + std::to_string(i), "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"j0", "j1", "j2", "j3"}));  // max batch 4
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(c.jobs.size(), 2u);  // only 2 credit left
  EXPECT_FALSE(s.NextChunk(&c));
  EXPECT_EQ(s.QueueDepth("m"), 4u);
  // DONE returns credit.
  auto done = s.Complete("w1", {"j0", "j1", "j2"});
  EXPECT_EQ(done.size(), 3u);
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"j6", "j7", "j8"}));
}

TEST(Scheduler, LeastRecentlyServedWorkerFirst) {
  Scheduler s;
  s.AddWorker("w1", Hello("w1", 100, {{"m", 1}}), 0);
  s.AddWorker("w2", Hello("w2", 100, {{"m", 1}}), 0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Add(MakeJob("j" + std::to_string(i), "m")).ok());
  std::vector<std::string> order;
  Chunk c;
  while (s.NextChunk(&c)) order.push_back(c.worker);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_NE(order[0], order[1]);
  EXPECT_EQ(order[0], order[2]);
  EXPECT_EQ(order[1], order[3]);
}

TEST(Scheduler, WorkersOnlyGetModelsTheyServe) {
  Scheduler s;
  s.AddWorker("wa", Hello("wa", 10, {{"a", 8}}), 0);
  s.AddWorker("wb", Hello("wb", 10, {{"b", 8}}), 0);
  ASSERT_TRUE(s.Add(MakeJob("x", "b")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(c.worker, "wb");
  EXPECT_TRUE(s.KnowsModel("a"));
  EXPECT_FALSE(s.KnowsModel("c"));
}

TEST(Scheduler, HigherPriorityFirstFifoWithin) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("low1", "m", 0)).ok());
  ASSERT_TRUE(s.Add(MakeJob("high1", "m", 5)).ok());
  ASSERT_TRUE(s.Add(MakeJob("low2", "m", 0)).ok());
  ASSERT_TRUE(s.Add(MakeJob("high2", "m", 5)).ok());
  ASSERT_TRUE(s.Add(MakeJob("mid", "m", 1)).ok());
  s.AddWorker("w", Hello("w", 100, {{"m", 100}}), 0);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"high1", "high2", "mid", "low1", "low2"}));
}

TEST(Scheduler, LostWorkerRequeuesAtFrontWithNextAttempt) {
  Scheduler s;
  s.AddWorker("w1", Hello("w1", 2, {{"m", 2}}), 0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Add(MakeJob("j" + std::to_string(i), "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  auto requeued = s.RemoveWorker("w1");
  ASSERT_EQ(requeued.size(), 2u);
  for (Job* j : requeued) EXPECT_EQ(j->attempt, 2);
  s.AddWorker("w2", Hello("w2", 10, {{"m", 10}}), 0);
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"j0", "j1", "j2", "j3"}));
  // A late DONE from the dead worker does not complete jobs now held by w2.
  EXPECT_TRUE(s.Complete("w1", {"j0"}).empty());
  EXPECT_EQ(s.Complete("w2", {"j0"}).size(), 1u);
}

TEST(Scheduler, SilentWorkersAreReported) {
  Scheduler s;
  s.AddWorker("old", Hello("old", 1, {{"m", 1}}), 100);
  s.AddWorker("new", Hello("new", 1, {{"m", 1}}), 1000);
  EXPECT_EQ(s.SilentWorkers(500), (std::vector<std::string>{"old"}));
  s.Touch("old", 2000);
  EXPECT_TRUE(s.SilentWorkers(500).empty());
}

TEST(Scheduler, TakeRemovesQueuedJob) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("b", "m")).ok());
  EXPECT_NE(s.Take("a"), nullptr);
  EXPECT_EQ(s.QueueDepth("m"), 1u);
  s.AddWorker("w", Hello("w", 10, {{"m", 10}}), 0);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace ferry::broker
