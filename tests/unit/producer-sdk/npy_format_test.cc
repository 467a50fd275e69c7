// The CLI's .npy reader/writer and tensor-file helpers.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "npy.h"
#include "tensor_files.h"

namespace ferry::cli {
namespace {

// Builds an .npy file by hand: magic, version, header length, header text, data.
std::string MakeNpy(int major, std::string header, const std::string& data) {
  size_t len_size = major == 1 ? 2 : 4;
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < len_size; ++i) out.push_back(static_cast<char>(header.size() >> (8 * i)));
  return out + header + data;
}

Tensor Sample(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.numel()) * ItemSize(dtype));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<char>(i * 7 + 1);
  if (dtype == DType::kBool)
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<char>(i % 2);
  return t;
}

TEST(NpyFormatTest, RoundTripsEveryNumpyDtype) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt64, DType::kInt32,
                  DType::kInt16, DType::kInt8, DType::kUInt8, DType::kBool}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{}, {5}, {2, 3}, {2, 0, 4}, {1, 2, 3, 2}}) {
      Tensor in = Sample(d, shape), out;
      std::string file;
      ASSERT_TRUE(EncodeNpy(in, &file).ok());
      EXPECT_TRUE(LooksLikeNpy(file));
      size_t header_end =
          10 + (static_cast<unsigned char>(file[8]) | static_cast<unsigned char>(file[9]) << 8);
      EXPECT_EQ(header_end % 64, 0u) << "data is 64-byte aligned";
      EXPECT_EQ(file[header_end - 1], '\n');
      Status s = ParseNpy(file, &out);
      ASSERT_TRUE(s.ok()) << DTypeName(d) << ": " << s.ToString();
      EXPECT_EQ(out.dtype, in.dtype) << DTypeName(d);
      EXPECT_EQ(out.shape, in.shape) << DTypeName(d);
      EXPECT_EQ(out.data, in.data) << DTypeName(d);
    }
  }
}

TEST(NpyFormatTest, WritesNumpyCompatibleHeader) {
  std::string file;
  ASSERT_TRUE(EncodeNpy(Tensor::From<float>({1, 2, 3}, {3}, DType::kFloat32), &file).ok());
  EXPECT_NE(file.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"),
            std::string::npos);
  EXPECT_EQ(file[6], '\x01');
}

TEST(NpyFormatTest, BFloat16IsWidenedToFloat32) {
  // 1.0 = 0x3F80, -2.5 = 0xC020 in bfloat16.
  Tensor bf;
  bf.dtype = DType::kBFloat16;
  bf.shape = {2};
  bf.data = std::string("\x80\x3F\x20\xC0", 4);
  std::string file;
  ASSERT_TRUE(EncodeNpy(bf, &file).ok());
  Tensor out;
  ASSERT_TRUE(ParseNpy(file, &out).ok());
  EXPECT_EQ(out.dtype, DType::kFloat32);
  EXPECT_EQ(out.As<float>(), (std::vector<float>{1.0f, -2.5f}));
}

TEST(NpyFormatTest, ReadsVersions2And3AndLooseHeaders) {
  std::string data(12, '\0');
  float v[3] = {1, 2, 3};
  std::memcpy(data.data(), v, 12);
  for (int major : {1, 2, 3}) {
    Tensor t;
    Status s =
        ParseNpy(MakeNpy(major, "{'descr':'<f4','fortran_order':False,'shape':(3,)}", data), &t);
    ASSERT_TRUE(s.ok()) << major << ": " << s.ToString();
    EXPECT_EQ(t.shape, std::vector<int64_t>{3});
    EXPECT_EQ(t.As<float>(), (std::vector<float>{1, 2, 3}));
  }
  Tensor t;  // key order, double quotes, spaces, Python 2 long
  ASSERT_TRUE(
      ParseNpy(
          MakeNpy(1, "{ \"shape\" : ( 3L , ) , \"fortran_order\": False, \"descr\": \"<f4\" }   ",
                  data),
          &t)
          .ok());
  EXPECT_EQ(t.shape, std::vector<int64_t>{3});
  ASSERT_TRUE(
      ParseNpy(MakeNpy(1, "{'descr': '<u1', 'fortran_order': False, 'shape': (2,)}", "ab"), &t)
          .ok());
  EXPECT_EQ(t.dtype, DType::kUInt8);
}

TEST(NpyFormatTest, RejectsWhatItCannotRead) {
  std::string f4(8, '\0');
  auto expect_error = [](const std::string& file, const std::string& words) {
    Tensor t;
    Status s = ParseNpy(file, &t);
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  expect_error("PK\x03\x04 a zip file", "magic");
  expect_error(std::string("\x93NUMPY", 6), "too short");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}", f4),
               "fortran_order");
  expect_error(MakeNpy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", f4),
               "big-endian");
  expect_error(MakeNpy(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (4,)}", f4),
               "unsupported dtype");
  expect_error(MakeNpy(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", f4),
               "unsupported dtype");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", f4),
               "need 12");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", f4), "need 4");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'shape': (2,)}", f4), "needs 'descr'");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", f4),
               "non-negative");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", f4), "tuple");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", f4),
               "True or False");
  expect_error(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4),
               "unexpected header key");
  expect_error(MakeNpy(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f4),
               "version 4");
  std::string cut = MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "");
  expect_error(cut.substr(0, 20), "past the end");
}

TEST(NpyFormatTest, ParseShape) {
  std::vector<int64_t> s;
  ASSERT_TRUE(ParseShape("1,8", &s).ok());
  EXPECT_EQ(s, (std::vector<int64_t>{1, 8}));
  ASSERT_TRUE(ParseShape("[2, 3, 4]", &s).ok());
  EXPECT_EQ(s, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_TRUE(ParseShape("2x3", &s).ok());
  EXPECT_EQ(s, (std::vector<int64_t>{2, 3}));
  ASSERT_TRUE(ParseShape("", &s).ok());
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(ParseShape("1,a", &s).ok());
  EXPECT_FALSE(ParseShape("1,-2", &s).ok());
}

TEST(NpyFormatTest, ReadTensorFileRawAndNpy) {
  auto dir =
      std::filesystem::temp_directory_path() / ("ferry-npy-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string raw = (dir / "x.bin").string(), npy = (dir / "x.dat").string();
  float v[6] = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteFile(raw, std::string_view(reinterpret_cast<char*>(v), sizeof(v))).ok());
  Tensor t;
  ASSERT_TRUE(ReadTensorFile(raw, "float32", "2,3", &t).ok());
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_TRUE(ReadTensorFile(raw, "float32", "", &t).ok());
  EXPECT_EQ(t.shape, std::vector<int64_t>{6});
  ASSERT_TRUE(ReadTensorFile(raw, "int16", "12", &t).ok());
  EXPECT_EQ(t.dtype, DType::kInt16);
  EXPECT_NE(ReadTensorFile(raw, "float32", "4,2", &t).message().find("needs 32"),
            std::string::npos);
  EXPECT_FALSE(ReadTensorFile(raw, "float99", "", &t).ok());
  EXPECT_FALSE(ReadTensorFile((dir / "missing").string(), "float32", "", &t).ok());
  // .npy is recognised by its magic, whatever the name; --dtype/--shape are ignored.
  std::string file;
  ASSERT_TRUE(EncodeNpy(Tensor::From<int32_t>({7, 8}, {1, 2}, DType::kInt32), &file).ok());
  ASSERT_TRUE(WriteFile(npy, file).ok());
  ASSERT_TRUE(ReadTensorFile(npy, "float64", "9", &t).ok());
  EXPECT_EQ(t.dtype, DType::kInt32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 2}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::cli
