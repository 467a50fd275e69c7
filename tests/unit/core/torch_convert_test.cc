// <ferry/torch_convert.h> and <ferry/torch_dtype.h>: the dtype table, and round trips through
// torch::Tensor for all ten dtypes.

#include "ferry/torch_convert.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

// The one table the worker and the SDK share: every wire dtype has a torch type of the same
// element size and the same name, and comes back; types Ferry does not carry are refused.
TEST(ClientTorchConvertTest, DtypeTableCoversEveryWireDtype) {
  int mapped = 0;
  for (int i = 0; i <= static_cast<int>(DType::kBool); ++i) {
    const DType d = static_cast<DType>(i);
    c10::ScalarType st = c10::ScalarType::Undefined;
    ASSERT_TRUE(ToTorchDType(d, &st)) << DTypeName(d);
    EXPECT_EQ(c10::elementSize(st), ItemSize(d)) << DTypeName(d);
    DType back = DType::kFloat32;
    ASSERT_TRUE(FromTorchDType(st, &back)) << DTypeName(d);
    EXPECT_EQ(back, d);
    ++mapped;
  }
  EXPECT_EQ(mapped, 10);
  DType unused;
  EXPECT_FALSE(FromTorchDType(c10::ScalarType::ComplexFloat, &unused));
  EXPECT_FALSE(FromTorchDType(c10::ScalarType::QInt8, &unused));
}

TEST(ClientTorchConvertTest, RoundTripsEveryDtype) {
  for (auto st :
       {torch::kFloat32, torch::kFloat16, torch::kBFloat16, torch::kFloat64, torch::kInt64,
        torch::kInt32, torch::kInt16, torch::kInt8, torch::kUInt8, torch::kBool}) {
    torch::Tensor x = (torch::arange(24) % 7).reshape({2, 3, 4}).to(st);
    Tensor t;
    Status s = FromTorch(x.transpose(0, 2), &t);  // non-contiguous input
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 3, 2}));
    EXPECT_EQ(t.data.size(), 24 * ItemSize(t.dtype));
    torch::Tensor back;
    ASSERT_TRUE(ToTorch(t, &back).ok());
    EXPECT_EQ(back.scalar_type(), st);
    EXPECT_TRUE(torch::equal(back, x.transpose(0, 2))) << c10::toString(st);
  }
}

TEST(ClientTorchConvertTest, MatchesFerryLayout) {
  Tensor t = Tensor::From<float>({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kFloat32);
  torch::Tensor x;
  ASSERT_TRUE(ToTorch(t, &x).ok());
  EXPECT_EQ(x[1][0].item<float>(), 4.f);
  t.shape = {4};
  EXPECT_EQ(ToTorch(t, &x).code(), codes::kInvalidArgument);
  Tensor out;
  EXPECT_EQ(FromTorch(torch::zeros({2}, torch::kComplexFloat), &out).code(),
            codes::kInvalidArgument);
  EXPECT_EQ(FromTorch(torch::Tensor(), &out).code(), codes::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
