// The broker's journal (broker/src/journal.h): the record's encoding -- what it keeps, what it
// deliberately drops, and that no damaged record crashes Decode -- and Stage/Commit/Forget/Load
// against a real redis-server.
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

#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "process.h"

namespace ferry::broker {
namespace {

// Tensor bytes with NUL and bytes that are not UTF-8.
const std::string kOddBytes = std::string("\0\xff\xfe\x80\xc3(\0z", 8);

// A msgpack "inputs" array of one uint8 tensor holding `data`, as SUBMIT carries it.
std::string PackInputs(const std::string& data) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_array(1);
  pk.pack_map(3);
  protocol::PackString(pk, "dtype");
  protocol::PackString(pk, "uint8");
  protocol::PackString(pk, "shape");
  pk.pack_array(1);
  pk.pack_int64(static_cast<int64_t>(data.size()));
  protocol::PackString(pk, "data");
  pk.pack_bin(static_cast<uint32_t>(data.size()));
  pk.pack_bin_body(data.data(), static_cast<uint32_t>(data.size()));
  return std::string(buf.data(), buf.size());
}

Job FullJob() {
  Job j;
  j.id = "job-1.a:b_c";
  j.model = "resnet50";
  j.priority = -7;
  j.timeout_ms = 2500;
  j.result_ttl_s = 600;
  j.attempt = 3;
  j.submitted_us = 1'700'000'000'123'456;
  j.deadline_us = 1'700'000'002'623'456;
  j.seq = 4'000'000'001;
  j.inputs_raw = PackInputs(kOddBytes);
  j.producer = std::string("\0\x01prod", 6);
  j.inline_result = true;
  j.notify = "ferry:notify:abc";
  j.phase = JobPhase::kDispatched;
  j.worker = "worker-routing-id";
  return j;
}

void ExpectJournaledFieldsEqual(const Job& want, const Job& got) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.model, want.model);
  EXPECT_EQ(got.priority, want.priority);
  EXPECT_EQ(got.timeout_ms, want.timeout_ms);
  EXPECT_EQ(got.result_ttl_s, want.result_ttl_s);
  EXPECT_EQ(got.attempt, want.attempt);
  EXPECT_EQ(got.submitted_us, want.submitted_us);
  EXPECT_EQ(got.deadline_us, want.deadline_us);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_TRUE(got.inputs_raw == want.inputs_raw) << "inputs changed in the round trip";
}

TEST(JournalRecord, RoundTripKeepsEveryJournaledField) {
  const Job job = FullJob();
  Job got;
  Status s = Journal::Decode(Journal::Encode(job), &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectJournaledFieldsEqual(job, got);
  // The inputs are the same msgpack, byte for byte: the tensor's odd bytes included.
  EXPECT_NE(got.inputs_raw.find(kOddBytes), std::string::npos);
}

// Attached inputs (bytes in data frames the job holds) are journaled with their bytes: the
// record stands alone, decodes to the "data" form, and a record that names an attached input
// (which the broker never writes) is refused.
TEST(JournalRecord, AttachedInputsAreJournaledWithTheirBytes) {
  Job job = FullJob();
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_array(3);
  protocol::PackAttachedTensor(pk, DType::kUInt8, {3});
  protocol::PackTensor(pk, DType::kUInt8, {2}, "xy", 2);
  protocol::PackAttachedTensor(pk, DType::kInt16, {2});
  job.inputs_raw.assign(buf.data(), buf.size());
  job.frames.emplace_back("abc", 3);
  job.frames.emplace_back("\x01\x02\x03\x04", 4);
  Job got;
  Status s = Journal::Decode(Journal::Encode(job), &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got.frames.empty());
  msgpack::object_handle oh = msgpack::unpack(got.inputs_raw.data(), got.inputs_raw.size());
  std::vector<protocol::TensorRef> t;
  ASSERT_TRUE(protocol::DecodeTensorList(oh.get(), &t, /*allow_stored=*/true).ok());
  ASSERT_EQ(t.size(), 3u);
  for (const auto& x : t) EXPECT_FALSE(x.attached);
  EXPECT_EQ(std::string(t[0].data, t[0].size), "abc");
  EXPECT_EQ(std::string(t[1].data, t[1].size), "xy");
  EXPECT_EQ(std::string(t[2].data, t[2].size), std::string("\x01\x02\x03\x04", 4));
  job.frames.clear();  // the attached form itself in a record: refused
  EXPECT_EQ(Journal::Decode(Journal::Encode(job), &got).code(), codes::kInvalidArgument);
}

TEST(JournalRecord, ConnectionStateIsNotJournaled) {
  // The producer's connection, its notify channel and where the job ran die with the broker:
  // a restored job is queued again, and its producer learns of the result by FINISHED only.
  Job got;
  ASSERT_TRUE(Journal::Decode(Journal::Encode(FullJob()), &got).ok());
  EXPECT_EQ(got.producer, "");
  EXPECT_FALSE(got.inline_result);
  EXPECT_EQ(got.notify, "");
  EXPECT_EQ(got.phase, JobPhase::kQueued);
  EXPECT_EQ(got.worker, "");
  const std::string record = Journal::Encode(FullJob());
  EXPECT_EQ(record.find("ferry:notify:abc"), std::string::npos);
  EXPECT_EQ(record.find("worker-routing-id"), std::string::npos);
}

// A record map with every field but those in `omit`.
std::string RecordWithout(const std::vector<std::string>& omit) {
  const Job j = FullJob();
  struct Field {
    const char* name;
    int64_t value;
  };
  const std::vector<Field> ints = {
      {"priority", j.priority},      {"timeout_ms", j.timeout_ms}, {"result_ttl_s", j.result_ttl_s},
      {"submitted", j.submitted_us}, {"deadline", j.deadline_us},  {"seq", j.seq},
      {"attempt", j.attempt}};
  auto kept = [&](const std::string& name) {
    return std::find(omit.begin(), omit.end(), name) == omit.end();
  };
  uint32_t n = 0;
  for (const char* name : {"id", "model", "inputs"}) n += kept(name);
  for (const auto& f : ints) n += kept(f.name);
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(n);
  for (const auto& [name, value] : {std::pair<const char*, std::string>{"id", j.id},
                                    std::pair<const char*, std::string>{"model", j.model}}) {
    if (!kept(name)) continue;
    protocol::PackString(pk, name);
    protocol::PackString(pk, value);
  }
  for (const auto& f : ints) {
    if (!kept(f.name)) continue;
    protocol::PackString(pk, f.name);
    pk.pack_int64(f.value);
  }
  std::string record(buf.data(), buf.size());
  if (kept("inputs")) {
    msgpack::sbuffer key;
    protocol::Packer kp(key);
    protocol::PackString(kp, "inputs");
    record.append(key.data(), key.size());
    record.append(j.inputs_raw);
  }
  return record;
}

TEST(JournalRecord, TheOnDiskFieldNamesDecode) {
  // The record's field names, written out by hand: a broker must read the journal an earlier
  // broker wrote, so renaming a field fails here even where Encode and Decode agree. (It also
  // guards the tests below: with nothing omitted the hand-built record is a valid one.)
  Job got;
  Status s = Journal::Decode(RecordWithout({}), &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectJournaledFieldsEqual(FullJob(), got);
}

TEST(JournalRecord, ARecordWithoutIdModelOrInputsFails) {
  for (const char* field : {"id", "model", "inputs"}) {
    Job got;
    Status s = Journal::Decode(RecordWithout({field}), &got);
    EXPECT_FALSE(s.ok()) << "decoded a record without \"" << field << "\"";
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  }
}

TEST(JournalRecord, MissingNumbersTakeTheirDefaults) {
  Job got;
  Status s = Journal::Decode(RecordWithout({"priority", "timeout_ms", "result_ttl_s", "submitted",
                                            "deadline", "seq", "attempt"}),
                             &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got.priority, 0);
  EXPECT_EQ(got.timeout_ms, 0);
  EXPECT_EQ(got.result_ttl_s, 0);
  EXPECT_EQ(got.submitted_us, 0);
  EXPECT_EQ(got.deadline_us, 0);
  EXPECT_EQ(got.seq, 0);
  EXPECT_EQ(got.attempt, 1);  // a job is on its first attempt unless the record says otherwise
}

TEST(JournalRecord, FieldsOfTheWrongTypeFail) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(3);
  protocol::PackString(pk, "id");
  pk.pack_int64(42);  // not a string
  protocol::PackString(pk, "model");
  protocol::PackString(pk, "m");
  protocol::PackString(pk, "inputs");
  pk.pack_array(0);
  Job got;
  EXPECT_FALSE(Journal::Decode(std::string(buf.data(), buf.size()), &got).ok());

  msgpack::sbuffer buf2;
  protocol::Packer pk2(buf2);
  pk2.pack_map(4);
  protocol::PackString(pk2, "id");
  protocol::PackString(pk2, "a");
  protocol::PackString(pk2, "model");
  protocol::PackString(pk2, "m");
  protocol::PackString(pk2, "priority");
  protocol::PackString(pk2, "high");  // not an integer
  protocol::PackString(pk2, "inputs");
  pk2.pack_array(0);
  Status s = Journal::Decode(std::string(buf2.data(), buf2.size()), &got);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("priority"), std::string::npos) << s.message();
}

TEST(JournalRecord, EmptyAndGarbageFail) {
  const std::vector<std::string> bad = {
      "",                                      // an empty map: no id
      "garbage",                               // a fixint and trailing bytes
      std::string("\xc1", 1),                  // a byte msgpack never uses
      std::string("\x93\x01\x02\x03", 4),      // an array, not a map
      std::string("\x2a", 1),                  // an integer, not a map
      std::string("\xdf\xff\xff\xff\xff", 5),  // a map claiming 4G entries
      std::string("\x81\xa2id", 4),            // a map cut off before its first value
  };
  for (const auto& bytes : bad) {
    Job got;
    EXPECT_FALSE(Journal::Decode(bytes, &got).ok()) << "decoded " << testing::PrintToString(bytes);
  }
  // A valid record followed by anything is not a record.
  Job got;
  EXPECT_FALSE(Journal::Decode(Journal::Encode(FullJob()) + "x", &got).ok());
}

TEST(JournalRecord, EveryTruncationFails) {
  const std::string record = Journal::Encode(FullJob());
  for (size_t n = 0; n < record.size(); ++n) {
    Job got;
    EXPECT_FALSE(Journal::Decode(record.substr(0, n), &got).ok())
        << "decoded " << n << " of " << record.size() << " bytes";
  }
}

TEST(JournalRecord, CorruptedBytesNeverCrash) {
  // Every byte of a record replaced by a few telling values (type bytes that claim huge or
  // invalid lengths among them). Some changes are still a record (a changed tensor byte or
  // number); whatever Decode accepts must then be a job that journals again unchanged.
  const std::string record = Journal::Encode(FullJob());
  size_t failed = 0;
  for (size_t i = 0; i < record.size(); ++i) {
    for (unsigned char v : {0x00, 0x7f, 0xc1, 0xdc, 0xdf, 0xff}) {
      std::string bytes = record;
      if (static_cast<unsigned char>(bytes[i]) == v) continue;
      bytes[i] = static_cast<char>(v);
      Job got;
      if (!Journal::Decode(bytes, &got).ok()) {
        ++failed;
        continue;
      }
      Job again;
      ASSERT_TRUE(Journal::Decode(Journal::Encode(got), &again).ok()) << "byte " << i;
      ExpectJournaledFieldsEqual(got, again);
    }
  }
  EXPECT_GT(failed, 0u);
}

// ---- against a real redis-server ------------------------------------------------------------

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
