// What producers and workers send the broker, round trips and rejections: SUBMIT's jobs (inputs
// in the body, stored in Redis or attached in frames of their own), READY's input specs per
// model, and ACCEPTED, the reply to SUBMIT.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "codec_test_util.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/hello_check.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

using codec_test::Unpacked;

TEST(Submit, JobRoundTripAndFieldErrors) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "jobs");
  pk.pack_array(2);
  Tensor x = Tensor::From<float>({1, 2, 3}, {3}, DType::kFloat32);
  PackSubmitJob(pk, "j1", "tiny", {x}, 5, 100, 60);
  pk.pack_map(2);  // a job without inputs
  PackString(pk, "id");
  PackString(pk, "j2");
  PackString(pk, "model");
  PackString(pk, "tiny");
  auto oh = Unpacked(buf);
  const msgpack::object* jobs = Find(oh.get(), "jobs");
  ASSERT_NE(jobs, nullptr);
  SubmitJob j;
  ASSERT_TRUE(DecodeSubmitJob(jobs->via.array.ptr[0], &j).ok());
  EXPECT_EQ(j.id, "j1");
  EXPECT_EQ(j.model, "tiny");
  EXPECT_EQ(j.priority, 5);
  EXPECT_EQ(j.timeout_ms, 100);
  EXPECT_EQ(j.result_ttl_s, 60);
  ASSERT_EQ(j.inputs.size(), 1u);
  EXPECT_EQ(ToTensor(j.inputs[0]).data, x.data);
  Status s = DecodeSubmitJob(jobs->via.array.ptr[1], &j);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("inputs"), std::string::npos) << s.message();
  EXPECT_EQ(j.id, "j2");  // the id is known, so the rejection can name it
}

// A stored input: only dtype and shape travel ("stored": true); its size comes from them, its
// data is null. Allowed in job inputs (SUBMIT, CHUNK), refused where bytes must be present.
TEST(Submit, StoredInputsTravelWithoutTheirBytes) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "jobs");
  pk.pack_array(1);
  Tensor small = Tensor::From<float>({1, 2}, {2}, DType::kFloat32);
  Tensor big = Tensor::From<int16_t>(std::vector<int16_t>(1000, 7), {10, 100}, DType::kInt16);
  PackSubmitJob(pk, "j-s", "audio", {small, big}, 0, 0, 0, {false, true});
  EXPECT_LT(buf.size(), 200u) << "the stored input's 2,000 bytes travelled";
  auto oh = Unpacked(buf);
  const msgpack::object* jobs = Find(oh.get(), "jobs");
  ASSERT_NE(jobs, nullptr);
  SubmitJob j;
  ASSERT_TRUE(DecodeSubmitJob(jobs->via.array.ptr[0], &j).ok());
  ASSERT_EQ(j.inputs.size(), 2u);
  EXPECT_FALSE(j.inputs[0].stored);
  EXPECT_EQ(ToTensor(j.inputs[0]).data, small.data);
  EXPECT_TRUE(j.inputs[1].stored);
  EXPECT_EQ(j.inputs[1].data, nullptr);
  EXPECT_EQ(j.inputs[1].size, 2000u);
  EXPECT_EQ(j.inputs[1].shape, (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(StoredInputs(j.inputs), std::vector<int32_t>{1});
  // Not in a result's outputs: there the bytes must be present.
  std::vector<TensorRef> refs;
  EXPECT_FALSE(DecodeTensorList(*j.inputs_obj, &refs).ok());
  ASSERT_TRUE(DecodeTensorList(*j.inputs_obj, &refs, /*allow_stored=*/true).ok());
  // "stored" is true, and alone: "stored": false (or anything but true) is malformed, with or
  // without data, and so is a stored tensor that has data too.
  for (const bool stored : {false, true}) {
    for (const bool with_data : {false, true}) {
      if (stored && !with_data) continue;  // the valid form, decoded above
      msgpack::sbuffer bad;
      Packer bp(bad);
      bp.pack_map(with_data ? 4 : 3);
      PackString(bp, "dtype");
      PackString(bp, "int16");
      PackString(bp, "shape");
      bp.pack_array(1);
      bp.pack_int64(4);
      PackString(bp, "stored");
      if (stored) {
        bp.pack_true();
      } else {
        bp.pack_false();
      }
      if (with_data) {
        PackString(bp, "data");
        bp.pack_bin(8);
        bp.pack_bin_body("01234567", 8);
      }
      msgpack::object_handle boh;
      ASSERT_TRUE(UnpackMap(bad.data(), bad.size(), &boh).ok());
      TensorRef t;
      EXPECT_EQ(DecodeTensor(boh.get(), &t, /*allow_stored=*/true).code(), codes::kInvalidArgument)
          << "stored " << stored << ", data " << with_data;
    }
  }
  EXPECT_EQ(Keys("ferry:").Input("j-s", 1), "ferry:input:j-s:1");
}

// Attached inputs: the body names dtype and shape, the bytes come as data frames; every tensor
// map marked "attached": true takes a frame, valid or not, and MatchFrames checks the sizes.
TEST(Submit, AttachedInputsAreCountedInOrderAndMatchedToTheirFrames) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "jobs");
  pk.pack_array(3);
  Tensor small = Tensor::From<float>({1, 2}, {2}, DType::kFloat32);
  Tensor big = Tensor::From<int16_t>(std::vector<int16_t>(1000, 7), {10, 100}, DType::kInt16);
  PackSubmitJob(pk, "j-a", "audio", {small, big, big}, 0, 0, 0, {false, false, true},
                {false, true, false});
  PackSubmitJob(pk, "bad id", "audio", {big}, 0, 0, 0, {}, {true});  // invalid, still counted
  pk.pack_int(7);                                                    // not a job: no frames
  EXPECT_LT(buf.size(), 300u) << "the attached input's 2,000 bytes travelled in the body";
  auto oh = Unpacked(buf);
  ASSERT_NE(Find(oh.get(), "jobs"), nullptr);
  const msgpack::object& jobs = *Find(oh.get(), "jobs");
  EXPECT_EQ(AttachedInJob(jobs.via.array.ptr[0]), 1u);
  EXPECT_EQ(AttachedInJob(jobs.via.array.ptr[1]), 1u);
  EXPECT_EQ(AttachedInJob(jobs.via.array.ptr[2]), 0u);
  EXPECT_EQ(AttachedCount(jobs), 2u);
  SubmitJob j;
  ASSERT_TRUE(DecodeSubmitJob(jobs.via.array.ptr[0], &j).ok());
  ASSERT_EQ(j.inputs.size(), 3u);
  EXPECT_FALSE(j.inputs[0].attached);
  EXPECT_TRUE(j.inputs[1].attached);
  EXPECT_FALSE(j.inputs[1].stored);
  EXPECT_EQ(j.inputs[1].data, nullptr);
  EXPECT_EQ(j.inputs[1].size, 2000u);
  EXPECT_TRUE(j.inputs[2].stored);
  EXPECT_FALSE(j.inputs[2].attached);
  // The frame's bytes become the tensor's; a frame of another size rejects the job.
  zmq::message_t frame(big.data.data(), big.data.size());
  ASSERT_TRUE(MatchFrames(&j.inputs, &frame, 1).ok());
  EXPECT_EQ(ToTensor(j.inputs[1]).data, big.data);
  zmq::message_t short_frame(big.data.data(), 1999);
  Status s = MatchFrames(&j.inputs, &short_frame, 1);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("1999 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(MatchFrames(&j.inputs, nullptr, 0).code(), codes::kInvalidArgument);
  // Not in a result's outputs; and "attached" is true, and alone: no "data", no "stored".
  std::vector<TensorRef> refs;
  EXPECT_FALSE(DecodeTensorList(*j.inputs_obj, &refs).ok());
  for (const char* extra : {"false", "data", "stored"}) {
    msgpack::sbuffer bad;
    Packer bp(bad);
    bp.pack_map(std::string(extra) == "false" ? 3 : 4);
    PackString(bp, "dtype");
    PackString(bp, "uint8");
    PackString(bp, "shape");
    bp.pack_array(1);
    bp.pack_int64(2);
    PackString(bp, "attached");
    if (std::string(extra) == "false") {
      bp.pack_false();
    } else {
      bp.pack_true();
      PackString(bp, extra);
      if (std::string(extra) == "data") {
        bp.pack_bin(2);
        bp.pack_bin_body("ab", 2);
      } else {
        bp.pack_true();
      }
    }
    msgpack::object_handle boh;
    ASSERT_TRUE(UnpackMap(bad.data(), bad.size(), &boh).ok());
    TensorRef t;
    EXPECT_EQ(DecodeTensor(boh.get(), &t, /*allow_stored=*/true).code(), codes::kInvalidArgument)
        << extra;
  }
}

// READY's optional "inputs" per model: a round trip, and what the decoder refuses.
TEST(Ready, InputSpecsRoundTripAndBoundsAreChecked) {
  WorkerHello h;
  h.worker = "w";
  h.device = "cpu";
  h.capacity = 4;
  InputSpec mel{"mel", DType::kFloat32, {-1, 80}};
  InputSpec len{"", DType::kInt64, {}};
  h.models = {{"asr", 8, std::vector<InputSpec>{mel, len}}, {"free", 2, std::nullopt}};
  zmq::message_t msg = EncodeHello(h);
  msgpack::object_handle oh;
  ASSERT_TRUE(UnpackMap(msg.data(), msg.size(), &oh).ok());
  WorkerHello back;
  ASSERT_TRUE(DecodeHello(oh.get(), &back).ok());
  ASSERT_EQ(back.models.size(), 2u);
  ASSERT_TRUE(back.models[0].inputs.has_value());
  EXPECT_EQ(*back.models[0].inputs, (std::vector<InputSpec>{mel, len}));
  EXPECT_FALSE(back.models[1].inputs.has_value());

  // One model whose "inputs" is whatever `pack` writes.
  auto decode = [](const std::function<void(Packer&)>& pack) {
    msgpack::sbuffer buf;
    Packer pk(buf);
    pk.pack_map(4);
    PackString(pk, "worker");
    PackString(pk, "w");
    PackString(pk, "device");
    PackString(pk, "cpu");
    PackString(pk, "capacity");
    pk.pack_int64(4);
    PackString(pk, "models");
    pk.pack_array(1);
    pk.pack_map(3);
    PackString(pk, "name");
    PackString(pk, "m");
    PackString(pk, "max_batch");
    pk.pack_int64(2);
    PackString(pk, "inputs");
    pack(pk);
    auto oh = Unpacked(buf);
    WorkerHello out;
    return DecodeHello(oh.get(), &out);
  };
  auto one = [](const char* dtype, std::vector<int64_t> shape) {
    return [=](Packer& pk) {
      pk.pack_array(1);
      pk.pack_map(2);
      PackString(pk, "dtype");
      PackString(pk, dtype);
      PackString(pk, "shape");
      pk.pack_array(static_cast<uint32_t>(shape.size()));
      for (int64_t d : shape) pk.pack_int64(d);
    };
  };
  EXPECT_TRUE(decode(one("uint8", {-1, 3})).ok());
  Status s = decode(one("float128", {1}));
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown dtype"), std::string::npos) << s.message();
  s = decode(one("uint8", {-2}));
  EXPECT_NE(s.message().find(">= -1"), std::string::npos) << s.message();
  s = decode(one("uint8", std::vector<int64_t>(17, 1)));
  EXPECT_NE(s.message().find("more than 16 dims"), std::string::npos) << s.message();
  s = decode([](Packer& pk) {
    pk.pack_array(65);
    for (int i = 0; i < 65; ++i) pk.pack_map(0);
  });
  EXPECT_NE(s.message().find("more than 64 inputs"), std::string::npos) << s.message();
  s = decode([](Packer& pk) { pk.pack_int64(3); });
  EXPECT_NE(s.message().find("must be an array"), std::string::npos) << s.message();
  s = decode([](Packer& pk) {
    pk.pack_array(1);
    pk.pack_map(1);
    PackString(pk, "dtype");
    PackString(pk, "uint8");
  });
  EXPECT_NE(s.message().find("\"shape\" must be an array"), std::string::npos) << s.message();
}

// A READY of worker "w" on the CPU, capacity 2, serving `tiny` (max batch 1).
WorkerHello TinyHello() {
  WorkerHello h;
  h.worker = "w";
  h.device = "cpu";
  h.capacity = 2;
  h.models = {{"tiny", 1, std::nullopt}};
  return h;
}

// `in` encoded, then decoded into *out (whose optional fields are overwritten); whether the
// encoded body holds `key`.
bool RoundTrip(const WorkerHello& in, const char* key, WorkerHello* out) {
  zmq::message_t msg = EncodeHello(in);
  msgpack::object_handle oh;
  EXPECT_TRUE(UnpackMap(msg.data(), msg.size(), &oh).ok());
  EXPECT_TRUE(DecodeHello(oh.get(), out).ok());
  return Find(oh.get(), key) != nullptr;
}

// READY's optional "held": a round trip (absent when empty), and CheckHello's bounds: at most
// `capacity` ids, each a job id.
TEST(Ready, HeldIdsRoundTripAndAreBounded) {
  WorkerHello h = TinyHello();
  WorkerHello back;
  back.held = {"stale"};
  EXPECT_FALSE(RoundTrip(h, "held", &back));
  EXPECT_TRUE(back.held.empty());
  EXPECT_TRUE(CheckHello(back).ok());
  h.held = {"job-1", "job-2"};
  EXPECT_TRUE(RoundTrip(h, "held", &back));
  EXPECT_EQ(back.held, (std::vector<std::string>{"job-1", "job-2"}));
  EXPECT_TRUE(CheckHello(back).ok());
  h.held.push_back("job-3");
  Status s = CheckHello(h);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("more than its capacity 2"), std::string::npos) << s.message();
  h.held = {"job 1"};
  s = CheckHello(h);
  EXPECT_NE(s.message().find("which is no job id"), std::string::npos) << s.message();
}

// READY's optional "heartbeat_ms" (absent when 0) and the broker's HEARTBEAT body: round trips,
// and the bounds (10..600000) CheckHello and DecodeHeartbeat keep.
TEST(Ready, HeartbeatIntervalsRoundTripAndAreBounded) {
  WorkerHello h = TinyHello();
  for (int64_t ms : {int64_t{0}, int64_t{1000}}) {
    h.heartbeat_ms = ms;
    WorkerHello back;
    back.heartbeat_ms = 7;
    EXPECT_EQ(RoundTrip(h, "heartbeat_ms", &back), ms != 0);
    EXPECT_EQ(back.heartbeat_ms, ms);
    EXPECT_TRUE(CheckHello(back).ok());
  }
  for (int64_t ms : {int64_t{9}, int64_t{600001}, int64_t{-1}}) {
    h.heartbeat_ms = ms;
    Status s = CheckHello(h);
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << ms;
    EXPECT_NE(s.message().find("\"heartbeat_ms\" must be 10..600000"), std::string::npos)
        << s.message();
  }
  EXPECT_EQ(DecodeHeartbeat(EncodeHeartbeat(250)), 250);
  EXPECT_EQ(DecodeHeartbeat(EncodeEmpty()), 0);  // a worker's, or an older broker's
  EXPECT_EQ(DecodeHeartbeat(EncodeHeartbeat(5)), 0);
  EXPECT_EQ(DecodeHeartbeat(zmq::message_t()), 0);
}

// READY's optional "redis_prefix": a round trip (absent when not said; "" is said), and its
// bound.
TEST(Ready, RedisPrefixRoundTripsAndIsBounded) {
  WorkerHello h = TinyHello();
  for (const std::optional<std::string>& prefix :
       {std::optional<std::string>(), std::optional<std::string>(""),
        std::optional<std::string>("other:")}) {
    h.redis_prefix = prefix;
    WorkerHello back;
    back.redis_prefix = "stale";
    EXPECT_EQ(RoundTrip(h, "redis_prefix", &back), prefix.has_value());
    EXPECT_EQ(back.redis_prefix, prefix);
  }
  h.redis_prefix = std::string(1025, 'p');
  EXPECT_EQ(CheckHello(h).code(), codes::kInvalidArgument);
}

TEST(Accepted, RoundTrip) {
  Accepted a;
  a.rid = 42;
  a.ids = {"a", "b"};
  a.rejected = {{"c", "unknown_model", "no worker serves model \"x\""}};
  zmq::message_t m = EncodeAccepted(a);
  msgpack::object_handle oh;
  ASSERT_TRUE(UnpackMap(m.data(), m.size(), &oh).ok());
  Accepted b;
  ASSERT_TRUE(DecodeAccepted(oh.get(), &b).ok());
  EXPECT_EQ(b.rid, 42);
  EXPECT_EQ(b.ids, a.ids);
  ASSERT_EQ(b.rejected.size(), 1u);
  EXPECT_EQ(b.rejected[0].code, "unknown_model");
}
}  // namespace
}  // namespace ferry::protocol
