// The broker's journal against a real redis-server: Stage/Commit/Forget/Restage/Load, noted
// models, failed and late writes. The record's encoding: journal_record_test.cc.
#include "journal.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "journal_testing.h"
#include "process.h"

namespace ferry::broker {
namespace {

using journal_testing::ExpectJournaledFieldsEqual;
using journal_testing::kOddBytes;
using journal_testing::PackInputs;

class JournalRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = server_.Connect();
    ASSERT_NE(client_, nullptr);
    journal_ = std::make_unique<Journal>(client_.get(), keys_);
  }

  static std::unique_ptr<Job> MakeJob(const std::string& id, int64_t seq) {
    auto j = std::make_unique<Job>();
    j->id = id;
    j->model = "m";
    j->seq = seq;
    j->submitted_us = 1000 + seq;
    j->inputs_raw = PackInputs(id + kOddBytes);
    return j;
  }

  // The scheduler's part in Commit: the pending jobs by id (those a test registered).
  const Journal::FindJob find_ = [this](const std::string& id) -> const Job* {
    auto it = pending_.find(id);
    return it == pending_.end() ? nullptr : it->second;
  };
  std::map<std::string, const Job*> pending_;

  // Loads with a fresh Journal, as a restarted broker does.
  std::vector<std::unique_ptr<Job>> Load(
      std::vector<std::string>* models = nullptr,
      std::vector<std::pair<std::string, std::string>>* unreadable = nullptr) {
    Journal fresh(client_.get(), keys_);
    std::vector<std::unique_ptr<Job>> jobs;
    std::vector<std::string> m;
    std::vector<std::pair<std::string, std::string>> u;
    Status s = fresh.Load(&jobs, models ? models : &m, unreadable ? unreadable : &u);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return jobs;
  }

  static std::vector<std::string> Ids(const std::vector<std::unique_ptr<Job>>& jobs) {
    std::vector<std::string> ids;
    for (const auto& j : jobs) ids.push_back(j->id);
    return ids;
  }

  int64_t Integer(const std::vector<std::string_view>& argv) {
    protocol::RedisReply reply;
    Status s = client_->Command(argv, &reply);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return reply.integer;
  }

  testutil::RedisServer server_;
  std::unique_ptr<protocol::RedisClient> client_;
  protocol::Keys keys_{"test:"};
  std::unique_ptr<Journal> journal_;
};

TEST_F(JournalRedisTest, CommittedJobsLoadInAcceptanceOrder) {
  // Staged out of seq order, so neither staging nor hash order gives acceptance order.
  const std::vector<int64_t> seqs = {5, 2, 9, 0, 7, 3, 8, 1, 6, 4};
  std::vector<std::unique_ptr<Job>> staged;
  for (int64_t seq : seqs) {
    staged.push_back(MakeJob("j" + std::to_string(seq), seq));
    journal_->Stage(*staged.back());
  }
  EXPECT_TRUE(journal_->has_staged());
  EXPECT_EQ(Integer({"HLEN", keys_.Journal()}), 0) << "Stage wrote before Commit";
  Status s = journal_->Commit(find_);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(journal_->idle());
  EXPECT_EQ(Integer({"HLEN", keys_.Journal()}), 10);

  auto jobs = Load();
  EXPECT_EQ(Ids(jobs),
            (std::vector<std::string>{"j0", "j1", "j2", "j3", "j4", "j5", "j6", "j7", "j8", "j9"}));
  for (const auto& want : staged) {
    auto it =
        std::find_if(jobs.begin(), jobs.end(), [&](const auto& j) { return j->id == want->id; });
    ASSERT_NE(it, jobs.end()) << want->id;
    ExpectJournaledFieldsEqual(*want, **it);
  }
}

TEST_F(JournalRedisTest, LoadReadsAJournalLargerThanOneScanBatch) {
  constexpr int64_t kJobs = 2500;  // Load scans 1000 fields at a time
  std::vector<std::unique_ptr<Job>> staged;
  for (int64_t i = 0; i < kJobs; ++i) {
    staged.push_back(MakeJob("j" + std::to_string(i), kJobs - i));  // reverse acceptance order
    journal_->Stage(*staged.back());
  }
  ASSERT_TRUE(journal_->Commit(find_).ok());
  auto jobs = Load();
  ASSERT_EQ(jobs.size(), static_cast<size_t>(kJobs));
  for (int64_t i = 0; i < kJobs; ++i) EXPECT_EQ(jobs[i]->seq, i + 1) << i;
}

TEST_F(JournalRedisTest, NotedModelsLoadAndExpire) {
  journal_->NoteModel("a");
  journal_->NoteModel("b");
  EXPECT_TRUE(journal_->has_writes());
  ASSERT_TRUE(journal_->Commit(find_).ok());
  std::vector<std::string> models;
  EXPECT_TRUE(Load(&models).empty());
  std::sort(models.begin(), models.end());
  EXPECT_EQ(models, (std::vector<std::string>{"a", "b"}));
  const int64_t ttl = Integer({"TTL", keys_.Models()});
  EXPECT_GT(ttl, 6 * 24 * 3600);
  EXPECT_LE(ttl, 7 * 24 * 3600);
}

// Every READY notes its models again, and while Redis is down the notes wait: they are kept
// once each, not once per READY (which grew without bound, and each failed commit rebuilt an
// SADD of all of them). Redis's slow log (every command, with its arguments) shows the SADD.
TEST_F(JournalRedisTest, ModelsNotedWhileRedisIsDownAreKeptOnceEach) {
  server_.Stop();
  for (int i = 0; i < 1000; ++i) {
    for (const char* model : {"a", "b", "c"}) journal_->NoteModel(model);
    EXPECT_FALSE(journal_->Commit(find_).ok());
  }
  server_.Restart();
  protocol::RedisReply reply;
  auto admin = server_.Connect();
  ASSERT_NE(admin, nullptr);
  ASSERT_TRUE(admin->Command({"CONFIG", "SET", "slowlog-log-slower-than", "0"}, &reply).ok());
  ASSERT_TRUE(admin->Command({"SLOWLOG", "RESET"}, &reply).ok());
  ASSERT_TRUE(journal_->Commit(find_).ok());
  ASSERT_TRUE(admin->Command({"SLOWLOG", "GET", "100"}, &reply).ok());
  std::vector<std::string> sadd;
  for (const auto& entry : reply.elements) {  // [id, time, duration, [arguments], ...]
    if (entry.elements.size() < 4 || entry.elements[3].elements.empty()) continue;
    const auto& args = entry.elements[3].elements;
    if (args[0].str != "SADD" && args[0].str != "sadd") continue;
    for (size_t i = 2; i < args.size(); ++i) sadd.push_back(args[i].str);
  }
  std::sort(sadd.begin(), sadd.end());
  EXPECT_EQ(sadd, (std::vector<std::string>{"a", "b", "c"}));
  std::vector<std::string> models;
  Load(&models);
  std::sort(models.begin(), models.end());
  EXPECT_EQ(models, (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(JournalRedisTest, ForgetAndCommitRemoveJobs) {
  std::vector<std::unique_ptr<Job>> staged;
  for (int64_t i = 0; i < 3; ++i) {
    staged.push_back(MakeJob("j" + std::to_string(i), i));
    journal_->Stage(*staged.back());
  }
  ASSERT_TRUE(journal_->Commit(find_).ok());

  journal_->Forget("j1", 12345);
  journal_->Forget("j0", 99999);
  EXPECT_EQ(journal_->removals(), 2u);
  EXPECT_EQ(journal_->oldest_removal_us(), 12345);
  EXPECT_FALSE(journal_->has_writes());  // removals alone are not urgent
  EXPECT_FALSE(journal_->idle());
  EXPECT_EQ(Integer({"HLEN", keys_.Journal()}), 3) << "Forget wrote before Commit";

  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_TRUE(journal_->idle());
  EXPECT_EQ(journal_->removals(), 0u);
  EXPECT_EQ(journal_->oldest_removal_us(), 0);
  EXPECT_EQ(Ids(Load()), (std::vector<std::string>{"j2"}));
}

TEST_F(JournalRedisTest, AJobWhoseResultExistsIsDroppedByLoad) {
  std::vector<std::unique_ptr<Job>> staged;
  for (int64_t i = 0; i < 3; ++i) {
    staged.push_back(MakeJob("j" + std::to_string(i), i));
    journal_->Stage(*staged.back());
  }
  ASSERT_TRUE(journal_->Commit(find_).ok());
  // The broker died after j1's result was written but before its removal was committed.
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("j1"), "result"}, &reply).ok());

  EXPECT_EQ(Ids(Load()), (std::vector<std::string>{"j0", "j2"}));
  EXPECT_EQ(Integer({"HEXISTS", keys_.Journal(), "j1"}), 0) << "Load left j1 in the journal";
  EXPECT_EQ(Integer({"EXISTS", keys_.Result("j1")}), 1) << "Load touched the result";
  EXPECT_EQ(Integer({"HLEN", keys_.Journal()}), 2);
}

// A record that does not decode is an accepted job all the same: Load names it (the broker
// fails the job, then removes the record as a finished job's). A field that is no job id is
// dropped.
TEST_F(JournalRedisTest, AnUnreadableRecordIsNamedByLoadAndAFieldThatIsNoIdDropped) {
  auto j0 = MakeJob("j0", 0);
  auto j1 = MakeJob("j1", 1);
  auto j2 = MakeJob("j2", 2);
  journal_->Stage(*j0);
  journal_->Stage(*j1);
  journal_->Stage(*j2);
  ASSERT_TRUE(journal_->Commit(find_).ok());
  protocol::RedisReply reply;
  ASSERT_TRUE(client_->Command({"HSET", keys_.Journal(), "bad", "garbage"}, &reply).ok());
  ASSERT_TRUE(client_->Command({"HSET", keys_.Journal(), "no id!", "garbage"}, &reply).ok());
  // In the same scan batch: a job whose result exists, so the removal of "no id!" and the
  // result checks share one pipeline.
  ASSERT_TRUE(client_->Command({"SET", keys_.Result("j2"), "result"}, &reply).ok());

  std::vector<std::pair<std::string, std::string>> unreadable;
  EXPECT_EQ(Ids(Load(nullptr, &unreadable)), (std::vector<std::string>{"j0", "j1"}));
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_EQ(unreadable[0].first, "bad");
  EXPECT_FALSE(unreadable[0].second.empty());
  EXPECT_EQ(Integer({"HEXISTS", keys_.Journal(), "bad"}), 1) << "removed before its result";
  EXPECT_EQ(Integer({"HEXISTS", keys_.Journal(), "no id!"}), 0);
  EXPECT_EQ(Integer({"HEXISTS", keys_.Journal(), "j2"}), 0);
  EXPECT_EQ(Integer({"HLEN", keys_.Journal()}), 3);
}

TEST_F(JournalRedisTest, AFailedCommitDropsStagedJobsAndKeepsRemovals) {
  auto j0 = MakeJob("j0", 0);
  journal_->Stage(*j0);
  ASSERT_TRUE(journal_->Commit(find_).ok());
  auto j1 = MakeJob("j1", 1);
  journal_->Stage(*j1);
  journal_->Forget("j0", 5);
  server_.Stop();
  Status s = journal_->Commit(find_);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_FALSE(journal_->has_staged());  // the caller rejects j1
  EXPECT_EQ(journal_->removals(), 2u);   // j0's removal waits for the next Commit, and j1's
  EXPECT_EQ(journal_->oldest_removal_us(), 5);
}

// While Redis is down, every SUBMIT's new jobs are staged and rejected: a commit that could not
// even connect sent nothing, so no removal is queued for them. Before, one per rejected id piled
// up for the whole outage (memory, and an HDEL of them all rebuilt every 5 ms).
TEST_F(JournalRedisTest, JobsRejectedWhileRedisIsDownQueueNoRemovals) {
  server_.Stop();
  for (int i = 0; i < 1000; ++i) {
    auto j = MakeJob("down-" + std::to_string(i), i);
    journal_->Stage(*j);
    EXPECT_EQ(journal_->Commit(find_).code(), codes::kUnavailable);
    EXPECT_FALSE(journal_->has_staged());
  }
  // The first commit may have written on the connection open before Redis stopped.
  EXPECT_LE(journal_->removals(), 1u);
  server_.Restart();
  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_TRUE(journal_->idle());
}

// An id whose removal waits (its write failed and may land late) accepted again while Redis is
// down: that commit sends nothing, and the removal it took back waits again -- the old write
// may still land, and its job must not come back after a restart.
TEST_F(JournalRedisTest, ARemovalTakenBackByAnIdAcceptedAgainWaitsAgainWhenNothingIsSent) {
  server_.Stop();
  auto first = MakeJob("again", 1);
  journal_->Stage(*first);
  (void)journal_->Commit(find_);  // on the connection open before: it may have been sent
  ASSERT_EQ(journal_->removals(), 1u);
  auto second = MakeJob("again", 2);
  journal_->Stage(*second);  // the client retries the id
  EXPECT_EQ(journal_->removals(), 0u);
  EXPECT_EQ(journal_->Commit(find_).code(), codes::kUnavailable);  // cannot connect
  EXPECT_EQ(journal_->removals(), 1u) << "the late write of \"again\" would stay journaled";
}

// A write that timed out may land all the same (Redis was slow, not gone): the job the broker
// then rejected `unavailable` must not stay journaled, or the next broker would restore and run
// it. The next Commit removes it.
TEST_F(JournalRedisTest, AJobOfAFailedCommitIsRemovedEvenWhenItsWriteLandsLate) {
  std::unique_ptr<protocol::RedisClient> impatient;
  ASSERT_TRUE(protocol::RedisClient::Connect(server_.endpoint(), 300, &impatient).ok());
  Journal journal(impatient.get(), keys_);
  auto late = MakeJob("late", 1);
  journal.Stage(*late);
  server_.Signal(SIGSTOP);  // the HSET waits in the server's socket
  Status s = journal.Commit(find_);
  server_.Signal(SIGCONT);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  ASSERT_TRUE(testutil::WaitFor([&] {
    return Integer({"HEXISTS", keys_.Journal(), "late"}) == 1;
  })) << "the timed-out write did not land (what this test is about)";
  EXPECT_EQ(journal.removals(), 1u);
  ASSERT_TRUE(journal.Commit(find_).ok());
  EXPECT_EQ(Integer({"HEXISTS", keys_.Journal(), "late"}), 0) << "a rejected job stays journaled";
}

// A requeued job's attempt is journaled again, so that a restarted broker goes on counting
// (--max-attempts) instead of starting over; a failed write keeps the update for the next.
TEST_F(JournalRedisTest, ARestagedJobLoadsWithItsNewAttemptEvenAfterAFailedWrite) {
  auto j = MakeJob("requeued", 1);
  journal_->Stage(*j);
  ASSERT_TRUE(journal_->Commit(find_).ok());
  pending_[j->id] = j.get();
  j->attempt = 2;
  journal_->Restage(j->id);
  EXPECT_TRUE(journal_->has_writes());
  server_.Stop();
  EXPECT_FALSE(journal_->Commit(find_).ok());
  EXPECT_TRUE(journal_->has_writes()) << "the update was dropped with the failed write";
  server_.Restart();
  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_TRUE(journal_->idle());
  auto loaded = Load();
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0]->attempt, 2);
}

// After a Redis restart every pending job is restaged (Broker::Impl::WatchRedisRestart): the
// records go back in parts of at most 1,024 per commit, so that one commit never carries them
// all, until every one is written.
TEST_F(JournalRedisTest, ManyRestagedJobsAreWrittenInPartsUntilAllAreBack) {
  constexpr int kJobs = 2500;
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < kJobs; ++i) {
    jobs.push_back(MakeJob("r" + std::to_string(i), i));
    pending_[jobs.back()->id] = jobs.back().get();
    journal_->Restage(jobs.back()->id);
  }
  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_EQ(Load().size(), 1024u) << "the first commit writes one part";
  int commits = 1;
  while (journal_->has_writes() && commits < 10) {
    ASSERT_TRUE(journal_->Commit(find_).ok());
    ++commits;
  }
  EXPECT_EQ(commits, 3) << "2,500 records in parts of 1,024";
  const auto loaded = Load();
  ASSERT_EQ(loaded.size(), static_cast<size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) EXPECT_EQ(loaded[i]->id, "r" + std::to_string(i));
}

// A restaged job is encoded at the commit, from the scheduler's job: one that is no longer pending
// then (taken, its removal not queued yet) is not written back.
TEST_F(JournalRedisTest, ARestagedJobThatIsNoLongerPendingIsNotWrittenBack) {
  auto j = MakeJob("gone", 1);
  journal_->Stage(*j);
  ASSERT_TRUE(journal_->Commit(find_).ok());
  j->attempt = 2;
  journal_->Restage(j->id);  // and not in pending_: the scheduler no longer has it
  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_TRUE(journal_->idle());
  auto loaded = Load();
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0]->attempt, 1);
}

// A job that finished (its removal waiting) and whose id is accepted again keeps its new record.
TEST_F(JournalRedisTest, AnIdAcceptedAgainAfterItsJobFinishedStaysJournaled) {
  auto j = MakeJob("again", 1);
  journal_->Stage(*j);
  ASSERT_TRUE(journal_->Commit(find_).ok());
  journal_->Forget("again", 10);  // finished
  journal_->Stage(*j);            // and accepted again, before the removal went out
  ASSERT_TRUE(journal_->Commit(find_).ok());
  EXPECT_EQ(Ids(Load()), (std::vector<std::string>{"again"}));
}

}  // namespace
}  // namespace ferry::broker
