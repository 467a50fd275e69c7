// GPU checks (label gpu; built with -DFERRY_GPU_TESTS=ON against CUDA libtorch, run on a GPU
// machine): a batch on cuda equals the same batch on cpu -- through pinned staging, the
// executor's own stream and the uint8 -> float conversion on the device -- several executors
// with their own streams agree with one, half precision stays close (the Whisper-shaped
// pipeline too), and the allocator measures a model's memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "batcher.h"
#include "cuda_support.h"
#include "executor.h"
#include "model.h"
#include "model_registry.h"
#include "test_models.h"
#include "whisper_model.h"

namespace ferry::worker {
namespace {

using testmodels::MakeJob;
using testmodels::Ramp;
using testmodels::Values;

ModelConfig Config(const std::string& name, const std::string& device) {
  ModelConfig c;
  c.name = name;
  c.path = testmodels::Path(name);
  c.device = device;
  c.max_batch = 32;
  return c;
}

std::vector<std::vector<float>> RunOn(const ModelConfig& c, const cuda::Stream* stream,
                                      std::vector<Job> jobs) {
  std::unique_ptr<Model> model;
  Status s = Model::Create(c, &model);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<std::vector<float>> out;
  if (!model) return out;
  Batcher batcher(stream);
  for (auto& r : batcher.Run(*model, std::move(jobs))) {
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    out.push_back(r.status.ok() ? Values<float>(r.outputs.at(0)) : std::vector<float>{});
  }
  return out;
}

std::vector<Job> Jobs(const std::string& model, int n) {
  std::vector<Job> jobs;
  for (int j = 0; j < n; ++j)
    jobs.push_back(MakeJob("g" + std::to_string(j), model, {Ramp({64}, 0.01f * j, 0.002f)}));
  return jobs;
}

void ExpectClose(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                 double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t j = 0; j < a.size(); ++j) {
    ASSERT_EQ(a[j].size(), b[j].size());
    for (size_t i = 0; i < a[j].size(); ++i)
      EXPECT_NEAR(a[j][i], b[j][i], tolerance) << j << "/" << i;
  }
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::Built() || !CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(GpuTest, BatchOnCudaEqualsCpu) {
  auto stream = cuda::StreamFromPool(0);
  ASSERT_NE(stream, nullptr);
  auto cpu = RunOn(Config("linear64", "cpu"), nullptr, Jobs("linear64", 16));
  auto gpu = RunOn(Config("linear64", "cuda:0"), stream.get(), Jobs("linear64", 16));
  ExpectClose(cpu, gpu, 1e-4);  // TF32/cuBLAS differ from CPU BLAS in the last bits
}

TEST_F(GpuTest, Uint8ConversionOnCudaEqualsCpu) {
  auto make = [](const std::string& device) {
    ModelConfig c = Config("identity", device);
    c.convert = {
        {0, DType::kFloat32, 1.0 / 255.0, {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}, 0}};
    return c;
  };
  auto jobs = [] {
    std::vector<Job> out;
    for (int j = 0; j < 4; ++j) {
      std::vector<uint8_t> px(3 * 8 * 8);
      for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + j) % 256);
      out.push_back(MakeJob("i" + std::to_string(j), "identity",
                            {Tensor::From<uint8_t>(px, {3, 8, 8}, DType::kUInt8)}));
    }
    return out;
  };
  auto stream = cuda::StreamFromPool(0);
  ExpectClose(RunOn(make("cpu"), nullptr, jobs()), RunOn(make("cuda:0"), stream.get(), jobs()),
              1e-5);
}

TEST_F(GpuTest, HalfPrecisionStaysClose) {
  ModelConfig half = Config("linear64", "cuda:0");
  half.half = true;
  auto stream = cuda::StreamFromPool(0);
  ExpectClose(RunOn(Config("linear64", "cpu"), nullptr, Jobs("linear64", 8)),
              RunOn(half, stream.get(), Jobs("linear64", 8)), 2e-2);
}

TEST_F(GpuTest, ExecutorsWithTheirOwnStreamsAgree) {
  ModelRegistry registry(ModelRegistry::Options{}, {Config("linear64", "cuda:0")});
  ASSERT_TRUE(registry.LoadEager().ok());
  Executor::Options o;
  o.device = "cuda:0";
  Executor reference(o, &registry, nullptr, nullptr);
  std::vector<std::vector<float>> want;
  for (auto& r : reference.RunBatch(Jobs("linear64", 8)))
    want.push_back(Values<float>(r.outputs.at(0)));
  std::vector<std::unique_ptr<Executor>> executors;
  for (int e = 0; e < 4; ++e) {
    o.index = e;
    executors.push_back(std::make_unique<Executor>(o, &registry, nullptr, nullptr));
  }
  std::vector<std::thread> threads;
  std::vector<std::vector<std::vector<float>>> got(4);
  for (int e = 0; e < 4; ++e) {
    threads.emplace_back([&, e] {
      for (int round = 0; round < 20; ++round) {
        got[e].clear();
        for (auto& r : executors[e]->RunBatch(Jobs("linear64", 8)))
          got[e].push_back(r.status.ok() ? Values<float>(r.outputs[0]) : std::vector<float>{});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int e = 0; e < 4; ++e) ExpectClose(want, got[e], 1e-6);
}

// The Whisper-shaped pipeline with the repository's `half = true`: the log-mel is computed in
// float32 (cuFFT has no float16 for n_fft 400) and handed to the float16 encoder, which decodes
// to token ids. Random weights: the log-mel and the encoder's output are checked against the
// float32 module's, the tokens for shape and range.
TEST_F(GpuTest, WhisperRunsInHalfPrecision) {
  const std::string path = (testmodels::ScratchDir("ferry-gpu-whisper-") / "whisper.pt").string();
  constexpr int64_t kTokens = 8;
  ferry::testmodels::MakeWhisper(ferry::testmodels::RandomWhisperWeights(3), kTokens).save(path);
  auto config = [&](bool half, const std::string& method) {
    ModelConfig c;
    c.name = "whisper";
    c.path = path;
    c.device = "cuda:0";
    c.max_batch = 4;
    c.half = half;
    c.method = method;
    return c;
  };
  auto clips = [] {  // 1 s of a different tone each
    std::vector<Job> jobs;
    for (int j = 0; j < 4; ++j) {
      std::vector<int16_t> pcm(16000);
      for (size_t i = 0; i < pcm.size(); ++i)
        pcm[i] = static_cast<int16_t>(8000 * std::sin(2 * M_PI * (150 + 50 * j) * i / 16000.0));
      jobs.push_back(MakeJob("c" + std::to_string(j), "whisper",
                             {Tensor::From<int16_t>(pcm, {16000}, DType::kInt16)}));
    }
    return jobs;
  };
  auto stream = cuda::StreamFromPool(0);
  const auto mels = RunOn(config(false, "log_mel"), stream.get(), clips());
  ExpectClose(mels, RunOn(config(true, "log_mel"), stream.get(), clips()), 2e-3);

  // The encoder on those log-mels ([80, 100] each): float16 stays finite and near float32 (a
  // loose bound on the mean error: four random layers in float16).
  auto mel_jobs = [&] {
    std::vector<Job> jobs;
    for (size_t j = 0; j < mels.size(); ++j)
      jobs.push_back(MakeJob("m" + std::to_string(j), "whisper",
                             {Tensor::From<float>(mels[j], {80, 100}, DType::kFloat32)}));
    return jobs;
  };
  const auto want = RunOn(config(false, "encode"), stream.get(), mel_jobs());
  const auto got = RunOn(config(true, "encode"), stream.get(), mel_jobs());
  ASSERT_EQ(got.size(), want.size());
  double error = 0, scale = 0;
  size_t n = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j].size(), want[j].size());
    for (size_t i = 0; i < got[j].size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[j][i])) << j << "/" << i;
      error += std::fabs(got[j][i] - want[j][i]);
      scale += std::fabs(want[j][i]);
      ++n;
    }
  }
  ASSERT_GT(n, 0u);
  EXPECT_LT(error, 0.05 * scale) << "mean error " << error / n << ", mean |x| " << scale / n;

  std::unique_ptr<Model> model;
  Status s = Model::Create(config(true, "forward"), &model);
  ASSERT_TRUE(s.ok()) << s.ToString();
  Batcher batcher(stream.get());
  auto results = batcher.Run(*model, clips());
  ASSERT_EQ(results.size(), 4u);
  for (auto& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_EQ(r.outputs.at(0).dtype, DType::kInt64);
    std::vector<int64_t> tokens = Values<int64_t>(r.outputs.at(0));
    ASSERT_EQ(tokens.size(), static_cast<size_t>(kTokens));
    for (int64_t t : tokens)
      EXPECT_TRUE(t >= 0 && t < ferry::testmodels::WhisperDims{}.n_vocab) << t;
  }
}

TEST_F(GpuTest, AllocatorMeasuresTheModel) {
  std::unique_ptr<Model> model;
  ModelConfig c = Config("big_a", "cuda:0");
  ASSERT_TRUE(Model::Create(c, &model).ok());
  EXPECT_GE(model->memory_bytes(), testmodels::kBigBytes);
  EXPECT_GE(cuda::AllocatedBytes(0), testmodels::kBigBytes);
}

}  // namespace
}  // namespace ferry::worker

// After the last test, leave without the libraries' static destructors: CUDA libtorch's ran after
// the CUDA driver had gone and jumped to address 0 (H200, torch 2.11 cu130: every test passed,
// then SIGSEGV at exit; docs/gpu.md). ferry-worker ends the same way. The test models' scratch
// directories, which a static's destructor would remove, go first.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::fprintf(stderr, "gpu tests: removing the scratch directories\n");
  ferry::worker::testmodels::RemoveScratchDirs();
  std::fprintf(stderr, "gpu tests: leaving with _Exit(%d)\n", rc);
  std::fflush(nullptr);
  std::_Exit(rc);
}
