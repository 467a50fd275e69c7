// What the journal's tests share (journal_record_test.cc, journal_redis_test.cc): a msgpack
// "inputs" array as SUBMIT carries it, with bytes that are not text, and the check that a
// record kept every journaled field.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ferry/protocol/codec.h"
#include "job.h"

namespace ferry::broker::journal_testing {

// Tensor bytes with NUL and bytes that are not UTF-8.
inline const std::string kOddBytes = std::string("\0\xff\xfe\x80\xc3(\0z", 8);

// A msgpack "inputs" array of one uint8 tensor holding `data`, as SUBMIT carries it.
inline std::string PackInputs(const std::string& data) {
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

inline void ExpectJournaledFieldsEqual(const Job& want, const Job& got) {
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

}  // namespace ferry::broker::journal_testing
