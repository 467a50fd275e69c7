// The codec's building blocks, round trips and rejections: dtype names and sizes, tensors of
// every dtype, malformed tensors (and sizes that would wrap), bodies that are not one msgpack map,
// and the job id alphabet. Message bodies: codec_submit_test.cc, codec_result_test.cc.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codec_test_util.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"

namespace ferry::protocol {
namespace {

using codec_test::Unpacked;

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

// A process that made ids, then forked (a pre-fork server: gunicorn, uWSGI, multiprocessing):
// parent and child go on making different ids. Before, the child inherited the parent's
// generator state and made the very ids the parent made next, so one job's result went to two.
TEST(Ids, AForkedChildMakesIdsOfItsOwn) {
  (void)NewUuid();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string id = NewUuid();
    _exit(write(fds[1], id.data(), id.size()) == static_cast<ssize_t>(id.size()) ? 0 : 1);
  }
  close(fds[1]);
  const std::string mine = NewUuid();
  std::string theirs(36, '\0');
  ASSERT_EQ(read(fds[0], theirs.data(), theirs.size()), 36);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(IsValidJobId(theirs)) << theirs;
  EXPECT_NE(mine, theirs);
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

}  // namespace
}  // namespace ferry::protocol
