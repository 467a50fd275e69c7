// ferry-make-models writes real TorchScript files that the worker loads and runs correctly:
// tiny.pt against its closed-form weights, multi.pt's two outputs, encoder.pt batched vs alone,
// resnet.pt's logits and resnet_u8.pt against resnet.pt on the same pixels, null.pt's identity.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "batcher.h"
#include "model.h"
#include "test_models.h"

namespace ferry::worker {
namespace {

using testmodels::MakeJob;

std::vector<float> AsFloats(const protocol::TensorRef& r) { return testmodels::Values<float>(r); }

class MakeModelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Per process: ctest runs each test of this suite as its own process, in parallel.
    dir_ = testmodels::ScratchDir("ferry_make_models_").string();  // removed at exit
    std::filesystem::remove_all(dir_);
    // The models checked here (whisper.pt has its own test, whisper_test.cc).
    const std::string cmd = std::string(FERRY_MAKE_MODELS) + " " + dir_ +
                            " tiny multi encoder resnet resnet_u8 null head expand > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  std::unique_ptr<Model> Load(const std::string& name) {
    std::unique_ptr<Model> model;
    Status s = Model::Create(name, dir_ + "/" + name + ".pt", "cpu", &model);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return model;
  }

  static std::string dir_;
};
std::string MakeModelsTest::dir_;

TEST_F(MakeModelsTest, TinyMatchesItsClosedForm) {
  auto model = Load("tiny");
  ASSERT_TRUE(model);
  std::vector<Job> jobs;
  std::vector<std::vector<float>> xs;
  for (int j = 0; j < 4; ++j) {
    std::vector<float> x(8);
    for (int i = 0; i < 8; ++i) x[i] = 0.25f * (i - j);
    xs.push_back(x);
    jobs.push_back(
        MakeJob("t" + std::to_string(j), "tiny", {Tensor::From<float>(x, {8}, DType::kFloat32)}));
  }
  auto results = Batcher().Run(*model, std::move(jobs));
  for (int j = 0; j < 4; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    auto y = AsFloats(results[j].outputs.at(0));
    ASSERT_EQ(y.size(), 8u);
    for (int c = 0; c < 8; ++c) {
      double want = 0.1 * c;
      for (int i = 0; i < 8; ++i) want += xs[j][i] * (0.01 * (i * 8 + c) - 0.3);
      EXPECT_NEAR(y[c], want, 1e-5) << j << "," << c;
    }
  }
}

TEST_F(MakeModelsTest, MultiHasTwoInputsAndTwoOutputs) {
  auto model = Load("multi");
  ASSERT_TRUE(model);
  auto results =
      Batcher().Run(*model, {MakeJob("m", "multi",
                                     {Tensor::From<float>({0, 1, 2, 3}, {4}, DType::kFloat32),
                                      Tensor::From<int64_t>({1, 2, 3}, {3}, DType::kInt64)})});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  ASSERT_EQ(results[0].outputs.size(), 2u);
  EXPECT_EQ(AsFloats(results[0].outputs[0]), std::vector<float>({1, 3, 5, 7}));
  EXPECT_EQ(results[0].outputs[1].dtype, DType::kInt64);
  int64_t sum = 0;
  std::memcpy(&sum, results[0].outputs[1].data, sizeof(sum));
  EXPECT_EQ(sum, 6);
}

TEST_F(MakeModelsTest, EncoderBatchedEqualsAlone) {
  auto model = Load("encoder");
  ASSERT_TRUE(model);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<Tensor> xs;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> v(10 * 384);
    for (auto& f : v) f = normal(rng);
    xs.push_back(Tensor::From<float>(v, {10, 384}, DType::kFloat32));
  }
  std::vector<Job> jobs;
  for (int j = 0; j < 3; ++j) jobs.push_back(MakeJob("e" + std::to_string(j), "encoder", {xs[j]}));
  auto batched = Batcher().Run(*model, std::move(jobs));
  for (int j = 0; j < 3; ++j) {
    ASSERT_TRUE(batched[j].status.ok()) << batched[j].status.ToString();
    EXPECT_EQ(batched[j].batch_size, 3);
    EXPECT_EQ(batched[j].outputs.at(0).shape, std::vector<int64_t>({10, 384}));
    auto alone = Batcher().Run(*model, {MakeJob("a", "encoder", {xs[j]})});
    ASSERT_TRUE(alone[0].status.ok());
    auto a = AsFloats(alone[0].outputs[0]), b = AsFloats(batched[j].outputs[0]);
    ASSERT_EQ(a.size(), b.size());
    double mean = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], 1e-3);
      mean += b[i];
    }
    EXPECT_NEAR(mean / b.size(), 0.0, 1e-3);  // final layer norm
  }
}

TEST_F(MakeModelsTest, ResNetU8MatchesResNetOnNormalizedPixels) {
  auto f32 = Load("resnet");
  auto u8 = Load("resnet_u8");
  ASSERT_TRUE(f32 && u8);
  // Small images keep the test fast; the network takes any H, W >= 32.
  constexpr int kH = 32, kW = 32;
  std::mt19937 rng(2);
  std::vector<uint8_t> pixels(3 * kH * kW);
  for (auto& p : pixels) p = static_cast<uint8_t>(rng() & 0xff);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std_dev[3] = {0.229f, 0.224f, 0.225f};
  std::vector<float> normalized(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    const size_t c = i / (kH * kW);
    normalized[i] = (static_cast<float>(pixels[i]) / 255.0f - mean[c]) / std_dev[c];
  }
  auto a = Batcher().Run(
      *f32,
      {MakeJob("f", "resnet", {Tensor::From<float>(normalized, {3, kH, kW}, DType::kFloat32)})});
  auto b = Batcher().Run(
      *u8,
      {MakeJob("u", "resnet_u8", {Tensor::From<uint8_t>(pixels, {3, kH, kW}, DType::kUInt8)})});
  ASSERT_TRUE(a[0].status.ok()) << a[0].status.ToString();
  ASSERT_TRUE(b[0].status.ok()) << b[0].status.ToString();
  EXPECT_EQ(a[0].outputs.at(0).shape, std::vector<int64_t>({1000}));
  auto x = AsFloats(a[0].outputs[0]), y = AsFloats(b[0].outputs[0]);
  ASSERT_EQ(x.size(), y.size());
  // 18 layers of float rounding (whose order depends on the BLAS threads): compare against the
  // scale of the logits, not each logit's own magnitude.
  double norm = 0, scale = 1;
  for (float v : x) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(x[i]));
    EXPECT_NEAR(x[i], y[i], 1e-3 * scale) << i;
    norm += std::fabs(x[i]);
  }
  EXPECT_GT(norm, 0);  // not all zeros
}

TEST_F(MakeModelsTest, NullReturnsItsInput) {
  auto model = Load("null");
  ASSERT_TRUE(model);
  auto results = Batcher().Run(
      *model, {MakeJob("n0", "null", {Tensor::From<float>({1.5f}, {1}, DType::kFloat32)}),
               MakeJob("n1", "null", {Tensor::From<float>({-2.f}, {1}, DType::kFloat32)})});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_EQ(AsFloats(results[0].outputs.at(0)), std::vector<float>({1.5f}));
  EXPECT_EQ(AsFloats(results[1].outputs.at(0)), std::vector<float>({-2.f}));
}

// head.pt: the first four values of a big int16 input, as float32; expand.pt: 64 bytes in,
// 960 KB out (the input repeated).
TEST_F(MakeModelsTest, HeadReadsFourValuesExpandRepeatsItsInput) {
  auto head = Load("head");
  ASSERT_TRUE(head);
  std::vector<int16_t> pcm(480000);
  for (size_t i = 0; i < pcm.size(); ++i) pcm[i] = static_cast<int16_t>(i % 1000 - 500);
  auto results = Batcher().Run(
      *head, {MakeJob("h0", "head", {Tensor::From<int16_t>(pcm, {480000}, DType::kInt16)})});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_EQ(AsFloats(results[0].outputs.at(0)), std::vector<float>({-500.f, -499.f, -498.f, -497.f}));

  auto expand = Load("expand");
  ASSERT_TRUE(expand);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = 0.5f * static_cast<float>(i);
  results = Batcher().Run(
      *expand, {MakeJob("e0", "expand", {Tensor::From<float>(x, {16}, DType::kFloat32)})});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  const std::vector<float> y = AsFloats(results[0].outputs.at(0));
  ASSERT_EQ(y.size(), 240000u);
  for (size_t i = 0; i < y.size(); i += 997) EXPECT_EQ(y[i], x[i % 16]) << i;
}

}  // namespace
}  // namespace ferry::worker
