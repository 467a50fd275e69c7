// Codec round trips for every dtype and rejection of malformed bodies.
#include <gtest/gtest.h>

#include <functional>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

msgpack::object_handle Unpacked(const msgpack::sbuffer& buf) {
  msgpack::object_handle oh;
  Status s = UnpackMap(buf.data(), buf.size(), &oh);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return oh;
}

TEST(DType, NamesRoundTripAndSizes) {
  const std::pair<const char*, size_t> all[] = {
      {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}, {"int64", 8},
      {"int32", 4},   {"int16", 2},   {"int8", 1},     {"uint8", 1},   {"bool", 1}};
  for (const auto& [name, size] : all) {
    DType d;
    ASSERT_TRUE(ParseDType(name, &d)) << name;
    EXPECT_STREQ(DTypeName(d), name);
    EXPECT_EQ(ItemSize(d), size) << name;
  }
  DType d;
  EXPECT_FALSE(ParseDType("float", &d));
  EXPECT_FALSE(ParseDType("", &d));
}

class TensorRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorRoundTrip, EncodesAndDecodesBytesExactly) {
  DType dtype;
  ASSERT_TRUE(ParseDType(GetParam(), &dtype));
  Tensor t;
  t.dtype = dtype;
  t.shape = {2, 3};
  t.data.resize(6 * ItemSize(dtype));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<char>(i * 37 + 11);
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "t");
  PackTensor(pk, t);
  auto oh = Unpacked(buf);
  TensorRef ref;
  ASSERT_TRUE(DecodeTensor(*Find(oh.get(), "t"), &ref).ok());
  Tensor back = ToTensor(ref);
  EXPECT_EQ(back.dtype, t.dtype);
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.data, t.data);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, TensorRoundTrip,
                         ::testing::Values("float32", "float16", "bfloat16", "float64", "int64",
                                           "int32", "int16", "int8", "uint8", "bool"));

// Packs {"t": {"dtype": dtype, "shape": shape, "data": bin(n)}} and decodes the tensor.
Status DecodeCustom(const std::string& dtype, const std::vector<int64_t>& shape, size_t n) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(1);
  PackString(pk, "t");
  pk.pack_map(3);
  PackString(pk, "dtype");
  PackString(pk, dtype);
  PackString(pk, "shape");
  pk.pack_array(static_cast<uint32_t>(shape.size()));
  for (auto d : shape) pk.pack_int64(d);
  PackString(pk, "data");
  std::string bytes(n, '\0');
  pk.pack_bin(static_cast<uint32_t>(n));
  pk.pack_bin_body(bytes.data(), static_cast<uint32_t>(n));
  msgpack::object_handle oh;
  FERRY_RETURN_IF_ERROR(UnpackMap(buf.data(), buf.size(), &oh));
  TensorRef ref;
  return DecodeTensor(*Find(oh.get(), "t"), &ref);
}

TEST(Tensor, RejectsMalformedTensors) {
  EXPECT_TRUE(DecodeCustom("float32", {2, 2}, 16).ok());
  EXPECT_EQ(DecodeCustom("float32", {2, 2}, 15).code(), codes::kInvalidArgument);
  EXPECT_EQ(DecodeCustom("float33", {2}, 8).code(), codes::kInvalidArgument);
  EXPECT_EQ(DecodeCustom("float32", {-1}, 0).code(), codes::kInvalidArgument);
  EXPECT_EQ(DecodeCustom("int8", std::vector<int64_t>(17, 1), 1).code(), codes::kInvalidArgument);
  EXPECT_TRUE(DecodeCustom("uint8", {0, 5}, 0).ok());  // empty tensors are legal
}

// Found by tests/fuzz/fuzz_tensor: 2^62 float64 elements "need" 2^65 bytes, which wrapped to 0,
// so a tensor of that shape with no data was accepted (and would have reached a device).
TEST(Tensor, RejectsShapesWhoseByteSizeWouldWrap) {
  const int64_t k31 = int64_t{1} << 31;
  EXPECT_EQ(DecodeCustom("float64", {k31, k31}, 0).code(), codes::kInvalidArgument);
  EXPECT_EQ(DecodeCustom("int32", {k31, k31}, 0).code(), codes::kInvalidArgument);
  EXPECT_EQ(DecodeCustom("uint8", {k31, k31, 4}, 0).code(), codes::kInvalidArgument);
  EXPECT_EQ(NumElements({k31, k31}), -1);
  EXPECT_EQ(NumElements({k31, k31 / 8}), kMaxElements);         // the largest shape still counted
  EXPECT_TRUE(DecodeCustom("float64", {0, k31, k31}, 0).ok());  // empty: 0 elements, 0 bytes
}

// Found by tests/fuzz/fuzz_submit: two stored inputs of 2^62 bytes each summed to 2^63, a
// negative job size once cast, which admission let through; a job's tensors stay under 2^62.
TEST(Tensor, RejectsJobsWhoseTensorsSumPast2To62Bytes) {
  auto list = [](int n) {
    msgpack::sbuffer buf;
    Packer pk(buf);
    pk.pack_map(1);
    PackString(pk, "inputs");
    pk.pack_array(static_cast<uint32_t>(n));
    for (int i = 0; i < n; ++i) PackStoredTensor(pk, DType::kFloat64, {1 << 30, 1 << 29});
    return buf;
  };
  std::vector<TensorRef> tensors;
  msgpack::sbuffer one = list(1);
  auto oh = Unpacked(one);
  ASSERT_TRUE(DecodeTensorList(*Find(oh.get(), "inputs"), &tensors, /*allow_stored=*/true).ok());
  EXPECT_EQ(tensors[0].size, uint64_t{1} << 62);
  msgpack::sbuffer two = list(2);
  oh = Unpacked(two);
  EXPECT_EQ(DecodeTensorList(*Find(oh.get(), "inputs"), &tensors, true).code(),
            codes::kInvalidArgument);
}

TEST(Body, RejectsWhatIsNotOneMsgpackMap) {
  msgpack::object_handle oh;
  EXPECT_TRUE(UnpackMap("", 0, &oh).ok());  // empty body = empty map
  EXPECT_EQ(UnpackMap("\x93\x01\x02\x03", 4, &oh).code(), codes::kMalformed);  // array
  EXPECT_EQ(UnpackMap("\xc1", 1, &oh).code(), codes::kMalformed);              // never used
  EXPECT_EQ(UnpackMap("\x81\xa1k", 3, &oh).code(), codes::kMalformed);         // truncated
  EXPECT_EQ(UnpackMap("\x80\x80", 2, &oh).code(), codes::kMalformed);          // trailing
  std::string garbage = "definitely not msgpack at all";
  EXPECT_FALSE(UnpackMap(garbage.data(), garbage.size(), &oh).ok());
}

TEST(Ids, ValidatesTheIdAlphabet) {
  EXPECT_TRUE(IsValidJobId("a"));
  EXPECT_TRUE(IsValidJobId("job-1.2_3:x"));
  EXPECT_TRUE(IsValidJobId(NewUuid()));
  EXPECT_FALSE(IsValidJobId(""));
  EXPECT_FALSE(IsValidJobId(std::string(129, 'a')));
  EXPECT_TRUE(IsValidJobId(std::string(128, 'a')));
  EXPECT_FALSE(IsValidJobId("has space"));
  EXPECT_FALSE(IsValidJobId("slash/"));
  EXPECT_NE(NewUuid(), NewUuid());
  // An RFC 4122 version-4 UUID: 8-4-4-4-12 lowercase hex digits, version 4, variant 10.
  for (int n = 0; n < 100; ++n) {
    const std::string id = NewUuid();
    ASSERT_EQ(id.size(), 36u) << id;
    for (size_t i = 0; i < id.size(); ++i) {
      if (i == 8 || i == 13 || i == 18 || i == 23) {
        EXPECT_EQ(id[i], '-') << id;
      } else {
        EXPECT_TRUE((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')) << id;
      }
    }
    EXPECT_EQ(id[14], '4') << id;
    EXPECT_NE(std::string("89ab").find(id[19]), std::string::npos) << id;
  }
}

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
  // A tensor that says "stored": false (or anything but true) and has no data is malformed.
  msgpack::sbuffer bad;
  Packer bp(bad);
  bp.pack_map(3);
  PackString(bp, "dtype");
  PackString(bp, "int16");
  PackString(bp, "shape");
  bp.pack_array(1);
  bp.pack_int64(4);
  PackString(bp, "stored");
  bp.pack_false();
  msgpack::object_handle boh;
  ASSERT_TRUE(UnpackMap(bad.data(), bad.size(), &boh).ok());
  TensorRef t;
  EXPECT_EQ(DecodeTensor(boh.get(), &t, /*allow_stored=*/true).code(), codes::kInvalidArgument);
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

TEST(RedisUrl, Parses) {
  RedisEndpoint ep;
  ASSERT_TRUE(ParseRedisUrl("redis://10.0.0.1:7000/2", &ep).ok());
  EXPECT_EQ(ep.host, "10.0.0.1");
  EXPECT_EQ(ep.port, 7000);
  EXPECT_EQ(ep.db, 2);
  RedisEndpoint ep2;
  ASSERT_TRUE(ParseRedisUrl("localhost:6380", &ep2).ok());
  EXPECT_EQ(ep2.port, 6380);
  EXPECT_FALSE(ParseRedisUrl("redis://host:notaport", &ep2).ok());
}

}  // namespace
}  // namespace ferry::protocol
