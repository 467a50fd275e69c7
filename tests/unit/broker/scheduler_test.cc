// The broker's queue and dispatch logic, without sockets.
#include "scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>

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
  std::vector<std::string> not_held;
  auto done = s.Complete("w1", {"j0", "j1", "j2"}, &not_held);
  EXPECT_EQ(done.size(), 3u);
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"j6", "j7", "j8"}));
}

// Worker w1 (capacity 4, max batch 4) took j0..j3 of eight queued jobs, started draining, and
// reported j0 and j1 in a DONE that says bye: it holds j2 and j3, with 2 credits back.
void DrainingHalfway(Scheduler& s) {
  s.AddWorker("w1", Hello("w1", 4, {{"m", 4}}), 0);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(s.Add(MakeJob("j" + std::to_string(i), "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  s.MarkLeaving("w1");
  std::vector<std::string> not_held;
  EXPECT_EQ(s.Complete("w1", {"j0", "j1"}, &not_held).size(), 2u);
}

// A draining worker reports its jobs in DONEs that say bye, maybe several: the credit the first
// ones return must not buy it new work, or its last BYE would requeue that work.
TEST(Scheduler, ALeavingWorkerGetsNoChunkForTheCreditItsDonesReturn) {
  Scheduler s;
  DrainingHalfway(s);
  Chunk c;
  EXPECT_FALSE(s.NextChunk(&c)) << "the leaving worker got " << c.jobs.size() << " more";
  std::vector<std::string> not_held;
  EXPECT_EQ(s.Complete("w1", {"j2", "j3"}, &not_held).size(), 2u);
  EXPECT_TRUE(s.workers().at("w1").in_flight.empty());  // holds nothing: the broker removes it
  EXPECT_FALSE(s.NextChunk(&c));
  EXPECT_EQ(s.QueueDepth("m"), 4u);
}

// A READY is a whole announcement: one that follows a `bye` DONE on the same connection (a
// drain called off) makes the worker ready for work again, instead of holding its credit idle.
TEST(Scheduler, AReadyAfterAByeTakesTheWorkerBack) {
  Scheduler s;
  DrainingHalfway(s);
  s.AddWorker("w1", Hello("w1", 4, {{"m", 4}}), 1);
  EXPECT_FALSE(s.workers().at("w1").leaving);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"j4", "j5"}));  // the 2 credits it has back
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

protocol::WorkerHello WithResident(protocol::WorkerHello h, std::vector<std::string> resident) {
  h.resident = std::move(resident);
  return h;
}

TEST(Scheduler, PrefersAWorkerWithTheModelWarm) {
  Scheduler s;
  // Both serve a and b; "cold" is first in LRU order but has only b loaded.
  s.AddWorker("cold", WithResident(Hello("cold", 4, {{"a", 4}, {"b", 4}}), {"b"}), 0);
  s.AddWorker("warm", WithResident(Hello("warm", 4, {{"a", 4}, {"b", 4}}), {"a"}), 0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Add(MakeJob("a" + std::to_string(i), "a")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(c.worker, "warm");
  EXPECT_EQ(c.jobs.size(), 4u);
  // The warm worker is full: more jobs of a spill over to the cold one rather than wait.
  for (int i = 4; i < 6; ++i) ASSERT_TRUE(s.Add(MakeJob("a" + std::to_string(i), "a")).ok());
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(c.worker, "cold");
  EXPECT_EQ(c.jobs.size(), 2u);
}

TEST(Scheduler, AModelWarmNowhereIsLoadedByPriorityAndAge) {
  Scheduler s;
  // One worker, a is warm, c is not warm anywhere: c's older job is not starved by a's.
  s.AddWorker("w", WithResident(Hello("w", 1, {{"a", 1}, {"c", 1}}), {"a"}), 0);
  ASSERT_TRUE(s.Add(MakeJob("c0", "c")).ok());
  ASSERT_TRUE(s.Add(MakeJob("a0", "a")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"c0"}));
}

TEST(Scheduler, OldestQueuedIsTheEarliestSubmittedAcrossPriorities) {
  Scheduler s;
  EXPECT_EQ(s.OldestQueuedSubmittedUs("m"), 0);
  auto job = [](const std::string& id, int64_t priority, int64_t submitted) {
    auto j = MakeJob(id, "m", priority);
    j->submitted_us = submitted;
    return j;
  };
  ASSERT_TRUE(s.Add(job("old-low", 0, 100)).ok());
  ASSERT_TRUE(s.Add(job("new-high", 5, 200)).ok());
  EXPECT_EQ(s.OldestQueuedSubmittedUs("m"), 100);
  s.AddWorker("w", Hello("w", 1, {{"m", 1}}), 0);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));  // takes new-high
  EXPECT_EQ(s.OldestQueuedSubmittedUs("m"), 100);
  ASSERT_TRUE(s.Take("old-low"));
  EXPECT_EQ(s.OldestQueuedSubmittedUs("m"), 0);
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
  // A late DONE from the presumed-dead worker does not finish j0 by itself: w2 holds it, so the
  // id comes back as not held (the broker finishes it once it sees the result in Redis, with
  // Take). w2's own DONE finishes it.
  EXPECT_EQ(s.workers().at("w2").in_flight.size(), 4u);
  std::vector<std::string> not_held;
  EXPECT_TRUE(s.Complete("w1", {"j0"}, &not_held).empty());
  EXPECT_EQ(not_held, (std::vector<std::string>{"j0"}));
  EXPECT_EQ(s.workers().at("w2").in_flight.size(), 4u);
  not_held.clear();
  EXPECT_EQ(s.Complete("w2", {"j0"}, &not_held).size(), 1u);
  EXPECT_TRUE(not_held.empty());
  EXPECT_FALSE(s.IsPending("j0"));
  EXPECT_EQ(s.workers().at("w2").in_flight.size(), 3u);
}

TEST(Scheduler, AJobTakenOnAnotherWorkersWordKeepsItsHoldersCreditUntilItsOwnDone) {
  // w1 was presumed dead and its job went to w2; w1's late DONE then proves the result is in
  // Redis and the broker takes the job (Take). w2 still runs it: its credit must not come back
  // before w2's own DONE, or the next chunk gives w2 more jobs than it has room for.
  Scheduler s;
  s.AddWorker("w1", Hello("w1", 1, {{"m", 1}}), 0);
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  s.RemoveWorker("w1");
  s.AddWorker("w2", Hello("w2", 1, {{"m", 1}}), 0);
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(c.worker, "w2");
  ASSERT_NE(s.Take("a"), nullptr);  // finished on w1's word
  EXPECT_FALSE(s.IsPending("a"));
  ASSERT_TRUE(s.Add(MakeJob("b", "m")).ok());
  EXPECT_EQ(s.workers().at("w2").credit(), 0);
  EXPECT_FALSE(s.NextChunk(&c));  // w2 is still busy with a
  std::vector<std::string> not_held;
  EXPECT_TRUE(s.Complete("w2", {"a"}, &not_held).empty());  // a ended already
  EXPECT_TRUE(not_held.empty());
  EXPECT_EQ(s.workers().at("w2").credit(), 1);
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"b"}));
  // An id it never ran gives nothing back.
  EXPECT_TRUE(s.Complete("w2", {"a", "unknown"}, &not_held).empty());
  EXPECT_EQ(s.workers().at("w2").credit(), 0);
}

// A job taken while on w2 (its turn's journal write failed: rejected unavailable) and submitted
// again under the same id runs on w3. w2's DONE for the old run gives w2 its credit back
// although the id now names w3's job; and removing w2 leaves w3's job alone.
TEST(Scheduler, AnIdReusedOnAnotherWorkerKeepsBothWorkersAccountsApart) {
  Scheduler s;
  s.AddWorker("w2", Hello("w2", 1, {{"m", 1}}), 0);
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_NE(s.Take("a"), nullptr);
  s.AddWorker("w3", Hello("w3", 1, {{"m", 1}}), 0);
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(c.worker, "w3");
  std::vector<std::string> not_held;
  EXPECT_TRUE(s.Complete("w2", {"a"}, &not_held).empty());
  EXPECT_EQ(not_held, std::vector<std::string>{"a"});  // w3's: finished once seen in Redis
  EXPECT_EQ(s.workers().at("w2").credit(), 1);
  EXPECT_TRUE(s.RemoveWorker("w2").empty()) << "w3's job was requeued";
  EXPECT_EQ(s.workers().at("w3").credit(), 0);
  EXPECT_EQ(s.QueueDepth("m"), 0u);
}

// A worker back after a broker restart (or after being dropped as silent) says which jobs it
// still holds (READY "held"): those waiting in the queue, or parked, stay with it instead of
// going to another worker; one dispatched elsewhere stays there; every id it names holds its
// credit until its DONE.
TEST(Scheduler, AWorkerClaimsTheJobsItStillHolds) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("queued", "m")).ok());
  auto late = MakeJob("parked", "m");
  late->deadline_us = 100;
  ASSERT_TRUE(s.Add(std::move(late), /*parked=*/true).ok());
  ASSERT_TRUE(s.Add(MakeJob("other-model", "n")).ok());
  ASSERT_TRUE(s.Add(MakeJob("elsewhere", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("left", "m")).ok());
  EXPECT_EQ(s.QueueDepth("m"), 4u) << "a parked job waits: it counts as queued";
  EXPECT_EQ(s.parked(), 1u);
  EXPECT_TRUE(s.TakeExpired(1000).empty()) << "nor expired by its deadline";
  s.AddWorker("w2", Hello("w2", 1, {{"m", 1}, {"n", 1}}), 0);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), std::vector<std::string>{"queued"}) << "the parked job is not dispatched";
  std::vector<std::string> not_held;
  ASSERT_EQ(s.Complete("w2", {"queued"}, &not_held).size(), 1u);
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(Ids(c), std::vector<std::string>{"other-model"});
  ASSERT_EQ(s.Complete("w2", {"other-model"}, &not_held).size(), 1u);
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(Ids(c), std::vector<std::string>{"elsewhere"});
  ASSERT_TRUE(s.Add(MakeJob("queued-again", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("n-job", "n")).ok());

  s.AddWorker("w1", Hello("w1", 8, {{"m", 8}}), 0);
  EXPECT_EQ(s.counters().dispatched, 3);
  std::vector<const Job*> were_waiting;
  EXPECT_EQ(
      s.Claim("w1", {"parked", "queued-again", "elsewhere", "n-job", "unknown"}, &were_waiting),
      2u);
  ASSERT_EQ(were_waiting.size(), 2u);
  EXPECT_EQ(were_waiting[0]->id, "parked");
  EXPECT_EQ(were_waiting[1]->id, "queued-again");
  EXPECT_EQ(s.counters().dispatched, 5) << "a claimed job that waited is dispatched now";
  const WorkerState& w1 = s.workers().at("w1");
  EXPECT_EQ(w1.credit(), 3) << "all five ids hold credit";
  ASSERT_NE(s.Find("parked"), nullptr);
  EXPECT_EQ(s.Find("parked")->phase, JobPhase::kDispatched);
  EXPECT_EQ(s.Find("parked")->worker, "w1");
  EXPECT_EQ(s.Find("queued-again")->worker, "w1");
  EXPECT_EQ(s.Find("elsewhere")->worker, "w2") << "running on w2 too: it stays there";
  EXPECT_EQ(s.Find("n-job")->phase, JobPhase::kQueued) << "w1 does not serve n";
  EXPECT_EQ(s.parked(), 0u);
  EXPECT_EQ(s.QueueDepth("m"), 1u);  // "left"
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(c.worker, "w1");
  EXPECT_EQ(Ids(c), std::vector<std::string>{"left"}) << "claimed jobs are not sent again";
  // Its DONE finishes the claimed jobs and gives their credit back.
  EXPECT_EQ(s.Complete("w1", {"parked", "queued-again", "unknown", "n-job"}, &not_held).size(), 2u);
  EXPECT_EQ(s.workers().at("w1").credit(), 6);
  // Removing it requeues what it holds now, as for jobs it was sent.
  EXPECT_EQ(s.RemoveWorker("w1").size(), 1u);  // "left"
}

// A worker that reconnects under its name before the broker dropped its old connection takes
// the jobs it holds from that connection: dropping the old one then requeues only the rest, so
// the held jobs spend no attempt (nor get poisoned) while they run. An id it holds already is
// not claimed again (a job of that id waiting now is a newer one), and claims past its
// capacity are not believed.
TEST(Scheduler, AReconnectedWorkerTakesItsJobsFromItsOldConnection) {
  Scheduler s;
  s.AddWorker("old", Hello("w", 2, {{"m", 2}}), 0);
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("b", "m")).ok());
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(Ids(c), (std::vector<std::string>{"a", "b"}));
  s.AddWorker("new", Hello("w", 2, {{"m", 2}}), 0);
  s.AddWorker("other", Hello("other", 4, {{"m", 4}}), 0);  // served first (the newest)
  std::vector<const Job*> were_waiting;
  EXPECT_EQ(s.Claim("new", {"a"}, &were_waiting), 1u);
  EXPECT_TRUE(were_waiting.empty()) << "it was dispatched already";
  EXPECT_EQ(s.counters().dispatched, 2);
  EXPECT_EQ(s.Find("a")->worker, "new");
  EXPECT_EQ(s.workers().at("old").in_flight.count("a"), 0u);
  const auto requeued = s.RemoveWorker("old");
  ASSERT_EQ(requeued.size(), 1u);
  EXPECT_EQ(requeued[0]->id, "b");
  EXPECT_EQ(s.Find("a")->attempt, 1);
  // Another worker's connection keeps what it runs.
  ASSERT_TRUE(s.NextChunk(&c));
  ASSERT_EQ(c.worker, "other");
  EXPECT_EQ(s.Claim("new", {"b"}), 0u);
  EXPECT_EQ(s.Find("b")->worker, "other");
  // A newer job of an id it holds is not its own; and a full worker claims nothing more.
  std::vector<std::string> not_held;
  ASSERT_EQ(s.Complete("other", {"b"}, &not_held).size(), 1u);
  ASSERT_TRUE(s.Add(MakeJob("b", "m")).ok());
  EXPECT_EQ(s.Claim("new", {"b", "c"}), 0u);
  EXPECT_EQ(s.Find("b")->phase, JobPhase::kQueued);
  EXPECT_EQ(s.workers().at("new").in_flight, (std::set<std::string>{"a", "b"}));
}

// Restored jobs keep the numbers their journal records hold (a record written again, for a
// requeued job's attempt, then keeps its place), a number already given is not given twice, and
// the jobs accepted afterwards come after them. None counts as a new acceptance.
TEST(Scheduler, RestoredJobsKeepTheirNumbersAndNewOnesComeAfter) {
  Scheduler s;
  for (const auto& [id, seq] :
       std::vector<std::pair<std::string, int64_t>>{{"a", 5}, {"b", 9}, {"c", 9}, {"b", 12}}) {
    auto j = MakeJob(id, "m");
    j->seq = seq;
    const Status st = s.AddRestored(std::move(j), /*parked=*/false);
    EXPECT_EQ(st.ok(), id != "b" || seq == 9) << id << " " << seq;  // b read twice: one job
  }
  EXPECT_EQ(s.Find("a")->seq, 5);
  EXPECT_EQ(s.Find("b")->seq, 9);
  EXPECT_EQ(s.Find("c")->seq, 10);
  ASSERT_TRUE(s.Add(MakeJob("new", "m")).ok());
  EXPECT_EQ(s.Find("new")->seq, 11);
  EXPECT_EQ(s.counters().accepted, 1);
  EXPECT_EQ(s.pending(), 4u);
}

// Parked jobs that no worker claimed leave by TakeParked (the broker expires them), in
// acceptance order; one cancelled meanwhile (Take) is gone from them.
TEST(Scheduler, ParkedJobsLeaveByTakeParkedOrTake) {
  Scheduler s;
  int64_t submitted_us = 100;
  for (const auto& id : {"p0", "p1", "p2"}) {
    auto j = MakeJob(id, "m");
    j->deadline_us = 5;
    j->submitted_us = submitted_us++;
    ASSERT_TRUE(s.Add(std::move(j), /*parked=*/true).ok());
  }
  EXPECT_EQ(s.pending(), 3u);
  EXPECT_EQ(s.QueueDepth("m"), 3u) << "parked jobs wait: they count as queued";
  EXPECT_EQ(s.ParkedOf("m"), 3u);
  EXPECT_EQ(s.ParkedOf("other"), 0u);
  EXPECT_EQ(s.OldestQueuedSubmittedUs("m"), 100) << "and in the age of the oldest waiting";
  EXPECT_EQ(s.OldestQueuedSubmittedUs("other"), 0);
  EXPECT_EQ(s.Add(MakeJob("p1", "m")).code(), codes::kDuplicate) << "a parked job is pending";
  ASSERT_NE(s.Take("p1"), nullptr);
  EXPECT_EQ(s.parked(), 2u);
  EXPECT_EQ(s.ParkedOf("m"), 2u);
  EXPECT_EQ(s.QueueDepth("m"), 2u);
  auto parked = s.TakeParked();
  ASSERT_EQ(parked.size(), 2u);
  EXPECT_EQ(parked[0]->id, "p0");
  EXPECT_EQ(parked[1]->id, "p2");
  EXPECT_EQ(s.pending(), 0u);
  EXPECT_EQ(s.parked(), 0u);
  EXPECT_EQ(s.QueueDepth("m"), 0u);
  EXPECT_EQ(s.pending_bytes(), 0);
}

TEST(Scheduler, ParkedOfCountsTheParkedJobsOfOneModel) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("queued", "m")).ok());
  ASSERT_TRUE(s.Add(MakeJob("parked", "m"), /*parked=*/true).ok());
  ASSERT_TRUE(s.Add(MakeJob("parked-other", "other"), /*parked=*/true).ok());
  EXPECT_EQ(s.QueueDepth("m"), 2u);
  EXPECT_EQ(s.ParkedOf("m"), 1u);
  EXPECT_EQ(s.ParkedOf("other"), 1u);
  EXPECT_EQ(s.ParkedOf("none"), 0u);
}

TEST(Scheduler, DoneForAJobTheSenderDoesNotHoldFinishesNothing) {
  Scheduler s;
  ASSERT_TRUE(s.Add(MakeJob("a", "m")).ok());
  std::vector<std::string> not_held;
  EXPECT_TRUE(s.Complete("some-worker", {"a", "unknown"}, &not_held).empty());
  EXPECT_EQ(not_held, (std::vector<std::string>{"a"}));  // pending but queued; unknown ignored
  EXPECT_EQ(s.QueueDepth("m"), 1u);
  EXPECT_EQ(s.pending(), 1u);
}

TEST(Scheduler, AgingServesOldLowPriorityJobsUnderHighPriorityLoad) {
  Scheduler s(/*aging_every=*/4);
  ASSERT_TRUE(s.Add(MakeJob("old-low", "m", 0)).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(s.Add(MakeJob("hi" + std::to_string(i), "m", 9)).ok());
  s.AddWorker("w", Hello("w", 1, {{"m", 1}}), 0);
  std::vector<std::string> order;
  Chunk c;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s.NextChunk(&c));
    order.push_back(c.jobs[0]->id);
    std::vector<std::string> not_held;
    s.Complete("w", {c.jobs[0]->id}, &not_held);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"hi0", "hi1", "hi2", "old-low"}));
}

TEST(Scheduler, TakeExpiredRemovesOnlyQueuedJobsPastTheirDeadline) {
  Scheduler s;
  auto a = MakeJob("a", "m");
  a->deadline_us = 100;
  auto b = MakeJob("b", "m");
  b->deadline_us = 1000;
  auto c = MakeJob("c", "m");  // no deadline
  ASSERT_TRUE(s.Add(std::move(a)).ok());
  ASSERT_TRUE(s.Add(std::move(b)).ok());
  ASSERT_TRUE(s.Add(std::move(c)).ok());
  auto expired = s.TakeExpired(500);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]->id, "a");
  EXPECT_EQ(s.QueueDepth("m"), 2u);
  // A dispatched job does not expire in the broker (the worker checks it before running).
  s.AddWorker("w", Hello("w", 10, {{"m", 10}}), 0);
  Chunk ch;
  ASSERT_TRUE(s.NextChunk(&ch));
  EXPECT_TRUE(s.TakeExpired(5000).empty());
}

// A job that leaves the queue -- finished, cancelled, dispatched -- takes its deadline along:
// the index stays as big as the queue (a day's timeout at thousands of jobs a second would
// otherwise pile up entries for a day), and an id accepted again is not expired by the deadline
// of its earlier job (a SUBMIT retried after `unavailable` did end `expired` early).
TEST(Scheduler, AJobLeavingTheQueueTakesItsDeadlineAlong) {
  Scheduler s;
  for (const auto& [id, deadline] :
       std::vector<std::pair<std::string, int64_t>>{{"a", 100}, {"b", 200}, {"c", 300}}) {
    auto j = MakeJob(id, "m");
    j->deadline_us = deadline;
    ASSERT_TRUE(s.Add(std::move(j)).ok());
  }
  EXPECT_EQ(s.deadlines(), 3u);
  ASSERT_NE(s.Take("a"), nullptr);  // finished, cancelled or rejected
  EXPECT_EQ(s.deadlines(), 2u);
  s.AddWorker("w", Hello("w", 1, {{"m", 1}}), 0);
  Chunk ch;
  ASSERT_TRUE(s.NextChunk(&ch));  // b goes to the worker
  EXPECT_EQ(Ids(ch), std::vector<std::string>{"b"});
  EXPECT_EQ(s.deadlines(), 1u);
  auto again = MakeJob("a", "m");  // the same id accepted again, with a later deadline
  again->deadline_us = 1000;
  ASSERT_TRUE(s.Add(std::move(again)).ok());
  auto expired = s.TakeExpired(500);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]->id, "c");
  EXPECT_NE(s.Find("a"), nullptr) << "expired by the deadline of the earlier job of its id";
  EXPECT_EQ(s.deadlines(), 1u);
  EXPECT_EQ(s.TakeExpired(2000).size(), 1u);
  EXPECT_EQ(s.deadlines(), 0u);
}

// The jobs of one SUBMIT share their deadline: each has an entry of its own (keyed by its seq
// too), so that one leaving the queue takes only its own, and the rest expire in order.
TEST(Scheduler, JobsSharingADeadlineLeaveAndExpireOneByOne) {
  Scheduler s;
  for (const char* id : {"a", "b", "c", "d"}) {
    auto j = MakeJob(id, "m");
    j->deadline_us = 100;
    ASSERT_TRUE(s.Add(std::move(j)).ok());
  }
  EXPECT_EQ(s.deadlines(), 4u);
  ASSERT_NE(s.Take("c"), nullptr);
  EXPECT_EQ(s.deadlines(), 3u);
  EXPECT_TRUE(s.TakeExpired(100).empty());  // not before the deadline has passed
  auto expired = s.TakeExpired(101);
  std::vector<std::string> ids;
  for (const auto& j : expired) ids.push_back(j->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "d"}));
  EXPECT_EQ(s.deadlines(), 0u);
  EXPECT_EQ(s.QueueDepth("m"), 0u);
}

// A job leaves its queue level wherever it is -- the front, the back, the middle of an even or
// an odd number of jobs (found from both ends at once) -- and the others keep their order.
TEST(Scheduler, TakingJobsFromAnyPlaceKeepsTheRestInOrder) {
  Scheduler s;
  for (const char* id : {"a", "b", "c", "d", "e", "f", "g"})
    ASSERT_TRUE(s.Add(MakeJob(id, "m")).ok());
  for (const char* id : {"d", "g", "a", "c", "e"}) {  // middle of 7, back, front, middle of 4, ...
    ASSERT_NE(s.Take(id), nullptr) << id;
    EXPECT_EQ(s.Find(id), nullptr);
  }
  EXPECT_EQ(s.QueueDepth("m"), 2u);
  s.AddWorker("w", Hello("w", 10, {{"m", 10}}), 0);
  Chunk c;
  ASSERT_TRUE(s.NextChunk(&c));
  EXPECT_EQ(Ids(c), (std::vector<std::string>{"b", "f"}));
}

TEST(Scheduler, PendingBytesTrackInputs) {
  Scheduler s;
  auto a = MakeJob("a", "m");
  a->inputs_raw = std::string(100, 'x');
  ASSERT_TRUE(s.Add(std::move(a)).ok());
  EXPECT_EQ(s.pending_bytes(), 100);
  s.Take("a");
  EXPECT_EQ(s.pending_bytes(), 0);
}

// Silent: more than `liveness` heartbeats of the broker's interval (here 100 us x 4), or of the
// longer one a worker announced in its READY (`slow`: 1 ms, so 4 ms).
TEST(Scheduler, SilentWorkersAreReported) {
  Scheduler s;
  s.AddWorker("old", Hello("old", 1, {{"m", 1}}), 100);
  s.AddWorker("new", Hello("new", 1, {{"m", 1}}), 1000);
  protocol::WorkerHello slow = Hello("slow", 1, {{"m", 1}});
  slow.heartbeat_ms = 1;
  s.AddWorker("slow", slow, 100);
  auto silent = [&](int64_t now) {
    std::vector<std::string> ids = s.SilentWorkers(now, 100, 4);
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  EXPECT_EQ(silent(900), (std::vector<std::string>{"old"}));
  s.Touch("old", 2000);
  EXPECT_TRUE(silent(900).empty());
  EXPECT_EQ(silent(4100), (std::vector<std::string>{"new", "old"}));  // slow: 4 ms since 100
  EXPECT_EQ(silent(4101), (std::vector<std::string>{"new", "old", "slow"}));
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
