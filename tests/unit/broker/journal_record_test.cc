// The broker's journal record (broker/src/journal.h): what it keeps, what it deliberately drops,
// and that no damaged record crashes Decode. Its Redis round trips: journal_redis_test.cc.
#include "journal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/protocol/codec.h"
#include "journal_testing.h"

namespace ferry::broker {
namespace {

using journal_testing::ExpectJournaledFieldsEqual;
using journal_testing::kOddBytes;
using journal_testing::PackInputs;

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

}  // namespace
}  // namespace ferry::broker
