// How results come back, round trips and rejections: DONE and FINISHED carrying small results
// inline, the result-notice fields ("notify" in a CHUNK entry, "notified" in DONE) and channels,
// and the result record in Redis (done and failed; a big output taking over the record's buffer).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codec_test_util.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

using codec_test::Unpacked;

// DONE and FINISHED carry small results inline as the exact record bytes; decoding gives views
// of those bytes, and a message without "results" decodes to none.
TEST(InlineResults, DoneAndFinishedRoundTripTheRecordBytes) {
  static const char kRecA[] =
      "\x83\xa2id\xa1"
      "a binary \x00 bytes";
  const std::string rec_a(kRecA, sizeof(kRecA) - 1);  // with its NUL
  const std::string rec_b = "second record";
  const InlineResults in = {{"a", rec_a}, {"b", rec_b}};

  zmq::message_t done = EncodeDone({"a", "b", "c"}, 1, {{"c", "failed"}}, in);
  msgpack::object_handle oh;
  ASSERT_TRUE(UnpackMap(done.data(), done.size(), &oh).ok());
  std::vector<std::string> ids;
  ASSERT_TRUE(GetStringArray(oh.get(), "ids", &ids).ok());
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "c"}));
  InlineResults out;
  ASSERT_TRUE(DecodeInlineResults(oh.get(), &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].first, "a");
  EXPECT_EQ(out[0].second, rec_a);
  EXPECT_EQ(out[1].first, "b");
  EXPECT_EQ(out[1].second, rec_b);
  DoneStatuses not_done;
  ASSERT_TRUE(DecodeDoneStatuses(oh.get(), &not_done).ok());
  ASSERT_EQ(not_done.size(), 1u);

  zmq::message_t fin = EncodeFinished({"a", "z"}, {{"a", rec_a}});
  ASSERT_TRUE(UnpackMap(fin.data(), fin.size(), &oh).ok());
  ASSERT_TRUE(GetStringArray(oh.get(), "ids", &ids).ok());
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "z"}));
  ASSERT_TRUE(DecodeInlineResults(oh.get(), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].second, rec_a);

  // Without results: no "results" key at all, and nothing decoded.
  zmq::message_t plain = EncodeFinished({"a"}, {});
  ASSERT_TRUE(UnpackMap(plain.data(), plain.size(), &oh).ok());
  EXPECT_EQ(Find(oh.get(), "results"), nullptr);
  out = {{"stale", "x"}};
  ASSERT_TRUE(DecodeInlineResults(oh.get(), &out).ok());
  EXPECT_TRUE(out.empty());
}

// The result-notice fields: "notify" in a CHUNK entry, "notified" in DONE, and the channel form.
TEST(Notify, ChunkEntryAndDoneRoundTripAndTheChannelForm) {
  for (const std::string notify : {"", "ferry:notify:abc-1"}) {
    msgpack::sbuffer inputs;
    Packer ipk(inputs);
    ipk.pack_array(0);
    msgpack::sbuffer buf;
    Packer pk(buf);
    PackChunkEntry(pk, "job-1", "m", std::string_view(inputs.data(), inputs.size()), 2, 0, 0, 1, 2,
                   0, notify);
    msgpack::object_handle oh = Unpacked(buf);
    EXPECT_EQ(Find(oh.get(), "notify") != nullptr, !notify.empty());
    ChunkJob job;
    job.notify = "stale";
    ASSERT_TRUE(DecodeChunkEntry(oh.get(), &job).ok());
    EXPECT_EQ(job.notify, notify);
    EXPECT_EQ(job.attempt, 2);
  }

  zmq::message_t done = EncodeDone({"a", "b"}, 0, {}, {}, {"b"});
  msgpack::object_handle oh;
  ASSERT_TRUE(UnpackMap(done.data(), done.size(), &oh).ok());
  std::vector<std::string> notified;
  ASSERT_TRUE(DecodeDoneNotified(oh.get(), &notified).ok());
  EXPECT_EQ(notified, std::vector<std::string>{"b"});
  zmq::message_t plain = EncodeDone({"a"}, 0);
  ASSERT_TRUE(UnpackMap(plain.data(), plain.size(), &oh).ok());
  EXPECT_EQ(Find(oh.get(), "notified"), nullptr);
  ASSERT_TRUE(DecodeDoneNotified(oh.get(), &notified).ok());
  EXPECT_TRUE(notified.empty());

  const Keys keys("fleet-a:");
  EXPECT_EQ(keys.NotifyChannel("t1"), "fleet-a:notify:t1");
  EXPECT_TRUE(keys.IsNotifyChannel("fleet-a:notify:t1"));
  EXPECT_TRUE(keys.IsNotifyChannel(keys.NotifyChannel(NewUuid())));
  EXPECT_FALSE(keys.IsNotifyChannel("fleet-a:notify:"));     // no token
  EXPECT_FALSE(keys.IsNotifyChannel("ferry:notify:t1"));     // another prefix
  EXPECT_FALSE(keys.IsNotifyChannel("fleet-a:notify:t 1"));  // a space
  EXPECT_FALSE(keys.IsNotifyChannel("fleet-a:result:t1"));
  EXPECT_FALSE(keys.IsNotifyChannel("fleet-a:notify:" + std::string(129, 'x')));
}

TEST(InlineResults, RejectsResultsThatAreNotAMapOfBinaries) {
  for (int variant = 0; variant < 2; ++variant) {
    msgpack::sbuffer buf;
    Packer pk(buf);
    pk.pack_map(1);
    PackString(pk, "results");
    if (variant == 0) {
      pk.pack_array(0);  // not a map
    } else {
      pk.pack_map(1);  // a string record instead of bin
      PackString(pk, "a");
      PackString(pk, "not binary");
    }
    msgpack::object_handle oh = Unpacked(buf);
    InlineResults out;
    EXPECT_EQ(DecodeInlineResults(oh.get(), &out).code(), codes::kInvalidArgument) << variant;
  }
}

TEST(Result, DoneAndFailedRoundTrip) {
  Tensor out = Tensor::From<int64_t>({7, 8}, {2}, DType::kInt64);
  ResultRecord r;
  r.id = "j";
  r.status = "done";
  r.model = "m";
  r.worker = "w";
  r.outputs.push_back(TensorRef{out.dtype, out.shape, out.data.data(), out.data.size()});
  r.batch_size = 4;
  r.attempt = 1;
  r.timing_us = {{"submitted", 1}, {"compute_end", 5}};
  msgpack::sbuffer buf;
  Packer pk(buf);
  PackResult(pk, r);
  Result res;
  ASSERT_TRUE(DecodeResult(buf.data(), buf.size(), &res).ok());
  EXPECT_EQ(res.state, JobState::kDone);
  ASSERT_EQ(res.outputs.size(), 1u);
  EXPECT_EQ(res.outputs[0].As<int64_t>(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(res.batch_size, 4);
  EXPECT_EQ(res.timing_us.at("compute_end"), 5);

  ResultRecord f;
  f.id = "k";
  f.status = "failed";
  f.error_code = "model_error";
  f.error_message = "boom";
  msgpack::sbuffer buf2;
  Packer pk2(buf2);
  PackResult(pk2, f);
  ASSERT_TRUE(DecodeResult(buf2.data(), buf2.size(), &res).ok());
  EXPECT_EQ(res.state, JobState::kFailed);
  EXPECT_EQ(res.error.code(), "model_error");
  EXPECT_EQ(res.error.message(), "boom");
  EXPECT_TRUE(res.outputs.empty());
}

// A record the decoder may take: its largest output of 64 KiB or more keeps the record's
// buffer (no copy into a new allocation); smaller outputs are copied; every field decodes as
// from a view, and the same bytes come out.
TEST(Result, BigOutputTakesOverTheRecordsBuffer) {
  std::vector<float> big_values(100000);
  for (size_t i = 0; i < big_values.size(); ++i) big_values[i] = static_cast<float>(i) * 0.5f;
  Tensor small = Tensor::From<int64_t>({7, 8}, {2}, DType::kInt64);
  Tensor big = Tensor::From<float>(big_values, {100000}, DType::kFloat32);
  Tensor medium = Tensor::From<float>(std::vector<float>(20000, 3.0f), {20000}, DType::kFloat32);
  ResultRecord r;
  r.id = "j-big";
  r.status = "done";
  r.model = "expand";
  r.worker = "w";
  for (const Tensor* t : {&small, &big, &medium})
    r.outputs.push_back(TensorRef{t->dtype, t->shape, t->data.data(), t->data.size()});
  r.batch_size = 3;
  r.timing_us = {{"submitted", 1}, {"finished", 9}};
  msgpack::sbuffer buf;
  Packer pk(buf);
  PackResult(pk, r);
  std::string record(buf.data(), buf.size());
  Result from_view;
  ASSERT_TRUE(DecodeResult(record.data(), record.size(), &from_view).ok());
  const char* buffer = record.data();
  Result res;
  ASSERT_TRUE(DecodeResult(std::move(record), &res).ok());
  ASSERT_EQ(res.outputs.size(), 3u);
  EXPECT_EQ(res.outputs[1].data.data(), buffer) << "the big output was copied";
  EXPECT_NE(res.outputs[2].data.data(), buffer);
  EXPECT_EQ(res.outputs[0].As<int64_t>(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(res.outputs[1].As<float>(), big_values);
  EXPECT_EQ(res.outputs[1].shape, std::vector<int64_t>{100000});
  EXPECT_EQ(res.outputs[2].data, medium.data);
  EXPECT_EQ(res.id, "j-big");
  EXPECT_EQ(res.model, "expand");
  EXPECT_EQ(res.worker, "w");
  EXPECT_EQ(res.batch_size, 3);
  EXPECT_EQ(res.timing_us, from_view.timing_us);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(res.outputs[k].data, from_view.outputs[k].data) << k;
  // A record that does not decode is refused the same way, whoever owns it.
  std::string broken(buf.data(), buf.size() - 7);
  Result bad;
  EXPECT_FALSE(DecodeResult(std::move(broken), &bad).ok());
  EXPECT_FALSE(DecodeResult(std::string("\x81\xa2id\x07"), &bad).ok());
}
}  // namespace
}  // namespace ferry::protocol
