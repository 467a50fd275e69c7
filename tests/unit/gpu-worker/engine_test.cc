// The inference engine on real TorchScript models (worker_test_models.cc): padding to the
// longest and to buckets, the lengths input, trimming, uint8 -> float conversion on the device,
// the configured method, out-of-memory halving with a lowered max batch, warmup, and
// concurrent executors giving the same results as sequential runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "batcher.h"
#include "executor.h"
#include "ferry/protocol/util.h"
#include "model.h"
#include "model_registry.h"
#include "test_models.h"
#include "warmup.h"

namespace ferry::worker {
namespace {

using testmodels::MakeJob;
using testmodels::Ramp;
using testmodels::Values;

ModelConfig Config(const std::string& name, const std::string& file = "") {
  ModelConfig c;
  c.name = name;
  c.path = testmodels::Path(file.empty() ? name : file);
  c.device = "cpu";
  c.max_batch = 32;
  return c;
}

std::unique_ptr<Model> Load(const ModelConfig& c) {
  std::unique_ptr<Model> model;
  Status s = Model::Create(c, &model);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return model;
}

ModelConfig PaddedConfig(std::vector<int64_t> buckets = {}) {
  ModelConfig c = Config("padded");
  c.padding.inputs = {0};
  c.padding.dim = 0;
  c.padding.value = 0.0;
  c.padding.buckets = std::move(buckets);
  c.padding.pass_lengths = true;
  c.padding.trim = {{0, 0, 1.0}};
  return c;
}

TEST(EngineTest, PadsToTheLongestPassesLengthsAndTrims) {
  auto model = Load(PaddedConfig());
  const std::vector<int64_t> lengths = {3, 5, 2};
  std::vector<Job> jobs;
  for (size_t j = 0; j < lengths.size(); ++j)
    jobs.push_back(MakeJob("p" + std::to_string(j), "padded", {Ramp({lengths[j], 4}, j * 100.f)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 1);  // different lengths, one batch
  for (size_t j = 0; j < lengths.size(); ++j) {
    const JobResult& r = results[j];
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.batch_size, 3);
    ASSERT_EQ(r.outputs.size(), 4u);
    // Output 0 trimmed back to the job's own length, values of its own input.
    EXPECT_EQ(r.outputs[0].shape, std::vector<int64_t>({lengths[j], 4}));
    Tensor x = Ramp({lengths[j], 4}, j * 100.f);
    auto want = x.As<float>();
    for (float& v : want) v = v * 2 + 1;
    EXPECT_EQ(Values<float>(r.outputs[0]), want);
    // Output 1 sums over the padded dim: padding with 0 leaves the sum unchanged.
    auto sum = Values<float>(r.outputs[1]);
    for (int d = 0; d < 4; ++d) {
      float s = 0;
      for (int64_t t = 0; t < lengths[j]; ++t) s += x.As<float>()[t * 4 + d];
      EXPECT_FLOAT_EQ(sum[d], s);
    }
    EXPECT_EQ(Values<int64_t>(r.outputs[2]), std::vector<int64_t>({lengths[j]}));  // true length
    EXPECT_EQ(Values<int64_t>(r.outputs[3]), std::vector<int64_t>({5}));  // padded to longest
  }
}

TEST(EngineTest, BucketsGroupJobsAndPadToTheBucket) {
  auto model = Load(PaddedConfig({4, 8}));
  const std::vector<int64_t> lengths = {3, 5, 2, 4, 9};
  std::vector<Job> jobs;
  for (size_t j = 0; j < lengths.size(); ++j)
    jobs.push_back(MakeJob("b" + std::to_string(j), "padded", {Ramp({lengths[j], 4}, 1.f)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 3);  // bucket 4: {3,2,4}; bucket 8: {5}; beyond: {9}
  const std::vector<int64_t> padded_to = {4, 8, 4, 4, 9};
  const std::vector<int64_t> batch = {3, 1, 3, 3, 1};
  for (size_t j = 0; j < lengths.size(); ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    EXPECT_EQ(results[j].batch_size, batch[j]) << j;
    EXPECT_EQ(Values<int64_t>(results[j].outputs[3]), std::vector<int64_t>({padded_to[j]})) << j;
    EXPECT_EQ(results[j].outputs[0].shape[0], lengths[j]);
  }
}

TEST(EngineTest, TrimRatioForStridedEncodersAndBadJobsFailAlone) {
  ModelConfig c = Config("stride2");
  c.padding.inputs = {0};
  c.padding.dim = -2;  // [T, 2]: T counted from the end
  c.padding.value = -1.0;
  c.padding.trim = {{0, 0, 0.5}};
  auto model = Load(c);
  Batcher batcher;
  auto results =
      batcher.Run(*model, {MakeJob("s5", "stride2", {Ramp({5, 2}, 0.f)}),
                           MakeJob("s2", "stride2", {Ramp({2, 2}, 10.f)}),
                           MakeJob("bad", "stride2", {Ramp({4}, 0.f)})});  // 1-D: cannot pad dim -2
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_EQ(results[0].outputs[0].shape, std::vector<int64_t>({3, 2}));  // ceil(5 / 2)
  EXPECT_EQ(Values<float>(results[0].outputs[0]), std::vector<float>({0, 1, 4, 5, 8, 9}));
  ASSERT_TRUE(results[1].status.ok());
  EXPECT_EQ(results[1].outputs[0].shape, std::vector<int64_t>({1, 2}));  // padding never leaks
  EXPECT_EQ(Values<float>(results[1].outputs[0]), std::vector<float>({10, 11}));
  EXPECT_EQ(results[2].status.code(), codes::kInvalidArgument);
  EXPECT_NE(results[2].status.message().find("dimension"), std::string::npos);
}

TEST(EngineTest, WithoutAPolicyOnlyIdenticalShapesShareABatch) {
  auto model = Load(Config("double"));
  Batcher batcher;
  auto results = batcher.Run(
      *model, {MakeJob("a", "double", {Ramp({3}, 0)}), MakeJob("b", "double", {Ramp({4}, 0)}),
               MakeJob("c", "double", {Ramp({3}, 5)})});
  EXPECT_EQ(batcher.forward_calls(), 2);
  EXPECT_EQ(results[0].batch_size, 2);
  EXPECT_EQ(results[1].batch_size, 1);
  EXPECT_EQ(Values<float>(results[2].outputs[0]), std::vector<float>({10, 12, 14}));
}

TEST(EngineTest, Uint8PixelsAreConvertedOnTheDevice) {
  ModelConfig c = Config("identity");
  c.convert = {{0, DType::kFloat32, 1.0 / 255.0, {0.5, 0.25}, {0.5, 0.25}, 0}};
  auto model = Load(c);
  std::vector<uint8_t> pixels = {0, 255, 51, 102, 0, 255, 51, 102};  // [2 channels, 2, 2]
  Tensor img = Tensor::From<uint8_t>(pixels, {2, 2, 2}, DType::kUInt8);
  Batcher batcher;
  auto results =
      batcher.Run(*model, {MakeJob("img", "identity", {img}), MakeJob("img2", "identity", {img})});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  const auto& out = results[0].outputs[0];
  EXPECT_EQ(out.dtype, DType::kFloat32);
  EXPECT_EQ(out.shape, std::vector<int64_t>({2, 2, 2}));
  auto v = Values<float>(out);
  for (size_t i = 0; i < 8; ++i) {
    const double mean = i < 4 ? 0.5 : 0.25;
    EXPECT_NEAR(v[i], (pixels[i] / 255.0 - mean) / mean, 1e-6) << i;
  }
  EXPECT_EQ(results[1].batch_size, 2);
}

TEST(EngineTest, ConfiguredMethodIsCalled) {
  ModelConfig c = Config("methods");
  c.method = "embed";
  auto model = Load(c);
  Batcher batcher;
  auto r = batcher.Run(*model, {MakeJob("m", "methods", {Ramp({2}, 1)})});
  ASSERT_TRUE(r[0].status.ok());
  EXPECT_EQ(Values<float>(r[0].outputs[0]), std::vector<float>({3, 6}));
  c.method = "missing";
  std::unique_ptr<Model> none;
  Status s = Model::Create(c, &none);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("missing"), std::string::npos);
}

// A result every decoder takes, or model_error: at most 16 dims per job and 64 tensors, dense.
// Before, such outputs were stored `done` and the C++ SDK then failed to read them
// (invalid_argument), and a sparse one failed `internal` with a whole C++ backtrace.
TEST(EngineTest, OutputsPastTheProtocolsLimitsAreModelErrors) {
  Batcher batcher;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"deep", "output 0 has 17 dims per job; at most 16"},
      {"many", "returned 65 tensors; a job's result holds at most 64"},
      {"sparse", "output 0 is a Sparse tensor; Ferry returns dense (strided) ones"},
  };
  for (const auto& [name, message] : cases) {
    auto model = Load(Config(name));
    ASSERT_NE(model, nullptr) << name;
    auto r = batcher.Run(*model, {MakeJob("j", name, {Ramp({2}, 1)})});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status.code(), codes::kModelError) << name << ": " << r[0].status.ToString();
    EXPECT_NE(r[0].status.message().find(message), std::string::npos) << r[0].status.message();
    EXPECT_EQ(r[0].status.message().find("frame #"), std::string::npos) << r[0].status.message();
  }
}

TEST(EngineTest, OutOfMemoryHalvesTheBatchAndLowersTheLimit) {
  auto model = Load(Config("oom"));
  BatchLimit limit(8, /*hold_us=*/60'000'000, /*step_us=*/10'000'000);
  std::vector<Job> jobs;
  for (int j = 0; j < 8; ++j)
    jobs.push_back(MakeJob("o" + std::to_string(j), "oom", {Ramp({2}, j)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs), &limit);
  for (int j = 0; j < 8; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << j << " " << results[j].status.ToString();
    EXPECT_EQ(results[j].batch_size, 2);
    EXPECT_EQ(Values<float>(results[j].outputs[0]), std::vector<float>({j + 1.f, j + 2.f}));
  }
  EXPECT_GE(batcher.out_of_memory(), 2);
  EXPECT_EQ(limit.Current(protocol::MonotonicMicros()), 2);
  // The next batch respects the lowered limit up front: no out-of-memory at all.
  Batcher next;
  std::vector<Job> more;
  for (int j = 0; j < 6; ++j)
    more.push_back(MakeJob("n" + std::to_string(j), "oom", {Ramp({2}, j)}));
  auto again = next.Run(*model, std::move(more), &limit);
  EXPECT_EQ(next.out_of_memory(), 0);
  EXPECT_EQ(next.forward_calls(), 3);
  for (const auto& r : again) EXPECT_TRUE(r.status.ok());
}

// One job too big for the device alone: its halves run out of memory down to itself, while
// those without it run. The limit goes to the largest batch that ran (4 of 8), not to 1 (it
// was halved at every level: 4, 2, then 1 for ~2 minutes, for every producer of the model).
TEST(EngineTest, OneJobTooBigForTheDeviceLowersTheLimitToWhatRanNotToOne) {
  auto model = Load(Config("oom_one"));
  BatchLimit limit(8, /*hold_us=*/60'000'000, /*step_us=*/10'000'000);
  std::vector<Job> jobs;
  for (int j = 0; j < 8; ++j)
    jobs.push_back(MakeJob("o" + std::to_string(j), "oom_one", {Ramp({2}, j == 5 ? 500 : j)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs), &limit);
  for (int j = 0; j < 8; ++j) {
    if (j == 5) {
      EXPECT_FALSE(results[j].status.ok());
      continue;
    }
    ASSERT_TRUE(results[j].status.ok()) << j << " " << results[j].status.ToString();
  }
  EXPECT_EQ(batcher.out_of_memory(), 4);  // 8, 4, 2 and 1 with the big job
  EXPECT_EQ(limit.Current(protocol::MonotonicMicros()), 4);
}

// When no part of an out-of-memory batch runs (here every job is too big; the same for a model
// whose batches are not split), the limit still comes down: to half the batch.
TEST(EngineTest, AnOutOfMemoryBatchOfWhichNothingRanHalvesTheLimit) {
  auto model = Load(Config("oom_all"));
  BatchLimit limit(8, /*hold_us=*/60'000'000, /*step_us=*/10'000'000);
  std::vector<Job> jobs;
  for (int j = 0; j < 8; ++j)
    jobs.push_back(MakeJob("a" + std::to_string(j), "oom_all", {Ramp({2}, j)}));
  Batcher batcher;
  for (const auto& r : batcher.Run(*model, std::move(jobs), &limit)) EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(limit.Current(protocol::MonotonicMicros()), 4);
}

TEST(EngineTest, WarmupRunsEveryBatchSizeAndBucket) {
  ModelConfig c = PaddedConfig({4, 8});
  c.warmup.inputs = {{DType::kFloat32, {1, 4}}};
  c.warmup.batch_sizes = {1, 4};
  c.warmup.iterations = 2;
  auto model = Load(c);
  int64_t runs = 0;
  EXPECT_TRUE(WarmUp(*model, c.max_batch, nullptr, &runs).ok());
  EXPECT_EQ(runs, 2 * 2 * 2);  // buckets x batch sizes x iterations

  ModelConfig bad = Config("linear8");
  bad.warmup.inputs = {{DType::kFloat32, {5}}};  // the model wants [8]
  auto linear = Load(bad);
  Status s = WarmUp(*linear, 4, nullptr);
  EXPECT_EQ(s.code(), codes::kModelError);
  EXPECT_NE(s.message().find("warmup"), std::string::npos);
}

TEST(EngineTest, ConcurrentExecutorsMatchSequentialRuns) {
  ModelConfig c = Config("linear64");
  ModelRegistry registry(ModelRegistry::Options{}, {c});
  ASSERT_TRUE(registry.LoadEager().ok());
  constexpr int kBatches = 24, kPerBatch = 8, kExecutors = 4;
  auto batch = [&](int b) {
    std::vector<Job> jobs;
    for (int j = 0; j < kPerBatch; ++j)
      jobs.push_back(MakeJob(std::to_string(b) + "-" + std::to_string(j), "linear64",
                             {Ramp({64}, 0.01f * (b * kPerBatch + j), 0.003f)}));
    return jobs;
  };
  std::vector<std::vector<std::vector<float>>> sequential(kBatches), concurrent(kBatches);
  Executor alone(Executor::Options{}, &registry, nullptr, nullptr);
  for (int b = 0; b < kBatches; ++b)
    for (auto& r : alone.RunBatch(batch(b)))
      sequential[b].push_back(Values<float>(r.outputs.at(0)));

  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Executor>> executors;
  for (int e = 0; e < kExecutors; ++e) {
    Executor::Options o;
    o.index = e;
    o.threads = 1;
    executors.push_back(std::make_unique<Executor>(o, &registry, nullptr, nullptr));
  }
  for (int e = 0; e < kExecutors; ++e) {
    threads.emplace_back([&, e] {
      for (int b = e; b < kBatches; b += kExecutors)
        for (auto& r : executors[e]->RunBatch(batch(b)))
          concurrent[b].push_back(r.status.ok() ? Values<float>(r.outputs[0])
                                                : std::vector<float>{});
    });
  }
  for (auto& t : threads) t.join();
  for (int b = 0; b < kBatches; ++b) {
    ASSERT_EQ(concurrent[b].size(), static_cast<size_t>(kPerBatch));
    for (int j = 0; j < kPerBatch; ++j) {
      ASSERT_EQ(concurrent[b][j].size(), 64u);
      for (size_t i = 0; i < 64; ++i)
        EXPECT_NEAR(concurrent[b][j][i], sequential[b][j][i], 1e-6) << b << "/" << j << "/" << i;
    }
  }
  EXPECT_EQ(registry.loads(), 1);  // one copy of the weights for every executor
}

// --flush-denormals: float denormals in and out of the model become zero, in the executor's
// thread and in every thread of its intra-op team (the "double" model's x * 2 over 256k
// elements is split across the team: with the mode set after the team existed, measured, half
// the outputs stayed denormal); without it they are kept as IEEE says. Each executor runs on a
// fresh thread, as in the worker, so no other test's thread is left flushing.
TEST(EngineTest, FlushDenormalsZeroesThemInEveryIntraOpThread) {
  ModelConfig c = Config("double");
  ModelRegistry registry(ModelRegistry::Options{}, {c});
  ASSERT_TRUE(registry.LoadEager().ok());
  constexpr int64_t kN = 1 << 18;
  constexpr float kTiny = 1e-40f;  // a denormal: float's smallest normal is 1.18e-38
  ASSERT_TRUE(std::fpclassify(kTiny) == FP_SUBNORMAL);
  bool supported = false;
  std::thread([&] { supported = SetFlushDenormals(true); }).join();  // a throwaway thread
  if (!supported) GTEST_SKIP() << "this CPU cannot flush denormals";
  // The input is made and the outputs are counted on this thread: on a flushing thread Ramp's
  // arithmetic would make the input zero, and a comparison would read a denormal as zero.
  const Tensor input = Ramp({kN}, kTiny, 0.0f);
  auto run = [&](bool flush) {
    std::vector<float> out;
    std::thread t([&] {
      Executor::Options o;
      o.threads = 2;
      o.flush_denormals = flush;
      Executor e(o, &registry, nullptr, nullptr);
      e.PrepareThread();  // first, as the executor's loop does
      std::vector<Job> jobs;
      jobs.push_back(MakeJob("d", "double", {input}));
      auto results = e.RunBatch(std::move(jobs));
      ASSERT_EQ(results.size(), 1u);
      ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
      out = Values<float>(results[0].outputs.at(0));
    });
    t.join();
    return out;
  };
  auto count = [](const std::vector<float>& out, float value) {
    return static_cast<size_t>(std::count(out.begin(), out.end(), value));
  };
  const std::vector<float> kept = run(false);
  ASSERT_EQ(kept.size(), static_cast<size_t>(kN));
  EXPECT_EQ(count(kept, 2 * kTiny), static_cast<size_t>(kN))
      << "without the flag denormals are computed";
  const std::vector<float> flushed = run(true);
  ASSERT_EQ(flushed.size(), static_cast<size_t>(kN));
  EXPECT_EQ(count(flushed, 0.0f), static_cast<size_t>(kN)) << "with the flag, every thread flushes";
}

}  // namespace
}  // namespace ferry::worker
