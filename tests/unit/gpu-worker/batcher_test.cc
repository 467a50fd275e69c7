// The worker's batch path, in-process, on real TorchScript models defined here: stacking,
// sub-batches by shape, inputs read in place, failing jobs isolated by halving, tuple/list
// outputs, every dtype.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batcher.h"
#include "executor.h"
#include "model.h"
#include "model_registry.h"
#include "test_models.h"

namespace ferry::worker {
namespace {

// Per process: ctest runs each test as its own process, in parallel.
std::filesystem::path BatcherDir() { return testmodels::ScratchDir("ferry_worker_batcher_"); }

using testmodels::MakeJob;

Tensor Floats(std::vector<float> v, std::vector<int64_t> shape) {
  return Tensor::From<float>(v, std::move(shape), DType::kFloat32);
}

// A view of `t` (which must outlive it).
protocol::TensorRef Ref(const Tensor& t) {
  protocol::TensorRef r;
  r.dtype = t.dtype;
  r.shape = t.shape;
  r.data = t.data.data();
  r.size = t.data.size();
  return r;
}

std::vector<float> AsFloats(const protocol::TensorRef& r) {
  std::vector<float> out(r.size / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), r.data, r.size);
  return out;
}

class BatcherTest : public ::testing::Test {
 protected:
  // Defines, saves and loads a TorchScript module, on the CPU with a default config but what
  // `configure` sets.
  std::unique_ptr<Model> Load(const std::string& name, const std::string& source,
                              const std::function<void(torch::jit::Module&)>& setup = {},
                              const std::function<void(ModelConfig&)>& configure = {}) {
    const auto dir = BatcherDir();
    std::filesystem::create_directories(dir);
    ModelConfig config;
    config.name = name;
    config.path = (dir / (name + ".pt")).string();
    config.device = "cpu";
    if (configure) configure(config);
    torch::jit::Module m("Test_" + name);
    if (setup) setup(m);
    m.define(source);
    m.save(config.path);
    std::unique_ptr<Model> model;
    Status s = Model::Create(config, &model);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return model;
  }

  // A linear model forward(x: [B,8] float32) -> [B,3].
  std::unique_ptr<Model> Linear() {
    return Load("linear", "def forward(self, x):\n    return torch.matmul(x, self.w) + 1.0\n",
                [](torch::jit::Module& m) {
                  m.register_parameter(
                      "w", torch::arange(24, torch::kFloat32).reshape({8, 3}) / 10.0, false);
                });
  }

  // What the model gives for one job run alone.
  std::vector<float> Alone(const Model& model, const Tensor& x) {
    Batcher single;
    auto results = single.Run(model, {MakeJob("alone", model.name(), {x})});
    EXPECT_TRUE(results.at(0).status.ok()) << results[0].status.ToString();
    EXPECT_EQ(results[0].batch_size, 1);
    return AsFloats(results[0].outputs.at(0));
  }

  static void ExpectNear(const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(b[i])));
  }

  static Tensor Row(float base) {
    std::vector<float> v(8);
    for (int i = 0; i < 8; ++i) v[i] = base + 0.5f * i;
    return Floats(v, {8});
  }
};

TEST_F(BatcherTest, StacksIdenticalShapesIntoOneForward) {
  auto model = Linear();
  std::vector<Job> jobs;
  for (int j = 0; j < 5; ++j) jobs.push_back(MakeJob("j" + std::to_string(j), "linear", {Row(j)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 1);
  ASSERT_EQ(results.size(), 5u);
  for (int j = 0; j < 5; ++j) {
    const JobResult& r = results[j];
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.job.entry.id, "j" + std::to_string(j));
    EXPECT_EQ(r.batch_size, 5);
    EXPECT_GT(r.compute_end_us, 0);
    EXPECT_LE(r.compute_start_us, r.compute_end_us);
    EXPECT_TRUE(r.job.entry.inputs.empty());  // released after compute
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].dtype, DType::kFloat32);
    EXPECT_EQ(r.outputs[0].shape, std::vector<int64_t>({3}));
    ExpectNear(AsFloats(r.outputs[0]), Alone(*model, Row(j)));
  }
}

TEST_F(BatcherTest, DifferentShapesRunAsSubBatches) {
  auto model = Load("double", "def forward(self, x):\n    return x * 2.0\n");
  std::vector<std::vector<int64_t>> shapes = {{3}, {3}, {5}, {3}, {5}, {2, 2}};
  std::vector<Job> jobs;
  for (size_t j = 0; j < shapes.size(); ++j) {
    std::vector<float> v(static_cast<size_t>(NumElements(shapes[j])));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(j * 10 + i);
    jobs.push_back(MakeJob("j" + std::to_string(j), "double", {Floats(v, shapes[j])}));
  }
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 3);
  const std::vector<int64_t> want_batch = {3, 3, 2, 3, 2, 1};
  for (size_t j = 0; j < shapes.size(); ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    EXPECT_EQ(results[j].batch_size, want_batch[j]) << j;
    EXPECT_EQ(results[j].outputs.at(0).shape, shapes[j]);
    auto out = AsFloats(results[j].outputs[0]);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], 2.0f * (j * 10 + i));
  }
}

TEST_F(BatcherTest, WrongShapeJobFailsAloneWithModelError) {
  auto model = Linear();
  std::vector<Job> jobs;
  for (int j = 0; j < 4; ++j) jobs.push_back(MakeJob("ok" + std::to_string(j), "linear", {Row(j)}));
  jobs.insert(jobs.begin() + 2, MakeJob("bad", "linear", {Floats({1, 2, 3, 4, 5}, {5})}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  ASSERT_EQ(results.size(), 5u);
  EXPECT_EQ(results[2].job.entry.id, "bad");
  EXPECT_FALSE(results[2].status.ok());
  EXPECT_EQ(results[2].status.code(), codes::kModelError);
  EXPECT_FALSE(results[2].status.message().empty());
  EXPECT_LE(results[2].status.message().size(), 1000u);
  // The library's own message comes first, ahead of the TorchScript traceback.
  EXPECT_NE(results[2].status.message().substr(0, 200).find("cannot be multiplied"),
            std::string::npos)
      << results[2].status.message();
  EXPECT_EQ(results[2].batch_size, 1);
  for (size_t j : {0, 1, 3, 4}) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    EXPECT_EQ(results[j].batch_size, 4);
    ExpectNear(AsFloats(results[j].outputs[0]), Alone(*model, Row(j < 2 ? j : j - 1)));
  }
}

// A job that does not match the inputs the model's config declares fails alone with
// invalid_argument, as the broker says it, though the model would take it (here int32 for
// float32): the broker lets such a job through before any worker announced the spec, or when
// another worker announced another one (a rolling upgrade).
TEST_F(BatcherTest, AJobNotMatchingTheDeclaredInputsFailsAloneWithInvalidArgument) {
  auto model =
      Load("declared", "def forward(self, x):\n    return x * 2.0\n", {}, [](ModelConfig& c) {
        c.inputs = std::vector<protocol::InputSpec>{{"x", DType::kFloat32, {-1}}};
      });
  ASSERT_TRUE(model);
  std::vector<Job> jobs;
  for (int j = 0; j < 3; ++j)
    jobs.push_back(MakeJob("ok" + std::to_string(j), "declared", {Row(j)}));
  jobs.insert(jobs.begin() + 1,
              MakeJob("ints", "declared", {Tensor::From<int32_t>({1, 2, 3}, {3}, DType::kInt32)}));
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[1].job.entry.id, "ints");
  EXPECT_EQ(results[1].status.code(), codes::kInvalidArgument) << results[1].status.ToString();
  EXPECT_EQ(results[1].status.message(),
            "model \"declared\" input 0 (\"x\"): expected float32 [-1], got int32 [3]");
  EXPECT_EQ(batcher.forward_calls(), 1);  // the others, in one batch
  for (size_t j : {0, 2, 3}) ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
}

TEST_F(BatcherTest, JobThatMakesTheModelThrowIsIsolatedByHalving) {
  // Same shapes, so all eight stack together; the model rejects negative inputs.
  auto model = Load("picky",
                    "def forward(self, x):\n"
                    "    assert bool((x >= 0.0).all()), 'negative input'\n"
                    "    return x + 1.0\n");
  std::vector<Job> jobs;
  for (int j = 0; j < 8; ++j) {
    float v = (j == 3 || j == 6) ? -1.0f : static_cast<float>(j);
    jobs.push_back(MakeJob("j" + std::to_string(j), "picky", {Floats({v, v}, {2})}));
  }
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_GT(batcher.forward_calls(), 1);
  for (int j = 0; j < 8; ++j) {
    if (j == 3 || j == 6) {
      EXPECT_EQ(results[j].status.code(), codes::kModelError) << j;
      EXPECT_NE(results[j].status.message().find("negative input"), std::string::npos)
          << results[j].status.message();
      EXPECT_EQ(results[j].batch_size, 1);
    } else {
      ASSERT_TRUE(results[j].status.ok()) << j << " " << results[j].status.ToString();
      EXPECT_EQ(AsFloats(results[j].outputs[0]), std::vector<float>(2, j + 1.0f));
      EXPECT_GE(results[j].batch_size, 1);
    }
  }
}

// `values.size() / 2` jobs of one [2] float32 input each, their bytes back to back in one
// buffer, as the input fetcher lays out stored inputs fetched together; the jobs share it (as
// Job::chunk) and so does *buffer, for the test to look at afterwards.
std::vector<Job> BackToBackJobs(const std::string& model, const std::vector<float>& values,
                                std::shared_ptr<std::vector<float>>* buffer) {
  *buffer = std::make_shared<std::vector<float>>(values);
  std::vector<Job> jobs;
  for (size_t j = 0; j < values.size() / 2; ++j) {
    Job job;
    job.entry.id = "b" + std::to_string(j);
    job.entry.model = model;
    job.entry.inputs.push_back({DType::kFloat32,
                                {2},
                                reinterpret_cast<const char*>((*buffer)->data() + 2 * j),
                                2 * sizeof(float)});
    job.chunk = *buffer;
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// On the CPU a batch whose inputs lie back to back is read where it is: an output that is the
// input itself points into the jobs' buffer, which it keeps alive after the jobs are gone.
TEST_F(BatcherTest, BackToBackInputsAreReadInPlaceAndOutputsKeepThemAlive) {
  auto model = Load("same", "def forward(self, x):\n    return x\n");
  std::shared_ptr<std::vector<float>> buffer;
  auto jobs = BackToBackJobs("same", {1, 2, 3, 4, 5, 6}, &buffer);
  const char* begin = reinterpret_cast<const char*>(buffer->data());
  const char* end = begin + buffer->size() * sizeof(float);
  std::weak_ptr<std::vector<float>> watch = buffer;
  buffer.reset();  // the jobs hold it now
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 1);
  ASSERT_EQ(results.size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    EXPECT_EQ(results[j].batch_size, 3);
    EXPECT_FALSE(results[j].job.chunk) << "the job let go of its bytes";
    const char* data = results[j].outputs.at(0).data;
    EXPECT_TRUE(data >= begin && data < end) << "not read in place";
    EXPECT_EQ(AsFloats(results[j].outputs[0]), std::vector<float>({2.0f * j + 1, 2.0f * j + 2}));
  }
  EXPECT_FALSE(watch.expired()) << "the outputs point into the buffer: it must live";
  results.clear();
  EXPECT_TRUE(watch.expired()) << "nothing else may hold it";
}

// copy_inputs: the model always gets a copy, even of a batch that lies back to back.
TEST_F(BatcherTest, CopyInputsModelsGetACopyOfABackToBackBatch) {
  auto model = Load("same_copied", "def forward(self, x):\n    return x\n", {},
                    [](ModelConfig& c) { c.copy_inputs = true; });
  ASSERT_TRUE(model);
  std::shared_ptr<std::vector<float>> buffer;
  Batcher batcher;
  auto results = batcher.Run(*model, BackToBackJobs("same_copied", {1, 2, 3, 4}, &buffer));
  const char* begin = reinterpret_cast<const char*>(buffer->data());
  const char* end = begin + buffer->size() * sizeof(float);
  for (size_t j = 0; j < 2; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    const char* data = results[j].outputs.at(0).data;
    EXPECT_FALSE(data >= begin && data < end) << "read in place";
    EXPECT_EQ(AsFloats(results[j].outputs[0]), std::vector<float>({2.0f * j + 1, 2.0f * j + 2}));
  }
}

// A batch read in place that fails is halved as any other: the halves read their part in place.
TEST_F(BatcherTest, AFailedBatchReadInPlaceIsHalved) {
  auto model = Load("picky_in_place",
                    "def forward(self, x):\n"
                    "    assert bool((x >= 0.0).all()), 'negative input'\n"
                    "    return x + 1.0\n");
  std::shared_ptr<std::vector<float>> buffer;
  Batcher batcher;
  auto results =
      batcher.Run(*model, BackToBackJobs("picky_in_place", {0, 0, 1, 1, -1, -1, 3, 3}, &buffer));
  EXPECT_GT(batcher.forward_calls(), 1);
  EXPECT_EQ(results[2].status.code(), codes::kModelError);
  EXPECT_EQ(results[2].status.message().find("writes into its inputs"), std::string::npos);
  for (size_t j : {0, 1, 3}) {
    ASSERT_TRUE(results[j].status.ok()) << j << " " << results[j].status.ToString();
    EXPECT_EQ(AsFloats(results[j].outputs.at(0)), std::vector<float>(2, (*buffer)[2 * j] + 1));
  }
}

// A model that writes into its inputs: its first such batch shows it (the bytes changed, so
// they were read in place, and the results are right); from then on it gets copies.
TEST_F(BatcherTest, AModelThatWritesIntoItsInputsGetsCopiesAfterItsFirstBatch) {
  auto model = Load("scale", "def forward(self, x):\n    x.mul_(2.0)\n    return x + 1.0\n");
  Batcher batcher;
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<std::vector<float>> buffer;
    auto results = batcher.Run(*model, BackToBackJobs("scale", {1, 2, 3, 4}, &buffer));
    for (size_t j = 0; j < 2; ++j) {
      ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
      EXPECT_EQ(AsFloats(results[j].outputs.at(0)),
                std::vector<float>({4.0f * j + 3, 4.0f * j + 5}));
    }
    if (round == 0) {
      EXPECT_EQ(*buffer, std::vector<float>({2, 4, 6, 8})) << "read in place";
    } else {
      EXPECT_EQ(*buffer, std::vector<float>({1, 2, 3, 4})) << "copied";
    }
  }
}

// If that first batch also fails, halving it would run the jobs on bytes the model already
// changed: the batch fails as a whole and says why. Later batches are copies, and halved.
TEST_F(BatcherTest, AFailedBatchThatWroteIntoItsInputsIsNotRetriedOnTheChangedBytes) {
  auto model = Load("scale_picky",
                    "def forward(self, x):\n"
                    "    x.mul_(2.0)\n"
                    "    assert bool((x >= 0.0).all()), 'negative input'\n"
                    "    return x + 1.0\n");
  std::shared_ptr<std::vector<float>> buffer;
  Batcher first;
  auto results = first.Run(*model, BackToBackJobs("scale_picky", {1, 1, -1, -1, 3, 3}, &buffer));
  EXPECT_EQ(first.forward_calls(), 1);
  for (const JobResult& r : results) {
    EXPECT_EQ(r.status.code(), codes::kModelError);
    EXPECT_NE(r.status.message().find("negative input"), std::string::npos) << r.status.message();
    EXPECT_NE(r.status.message().find("writes into its inputs"), std::string::npos)
        << r.status.message();
  }
  Batcher second;
  results = second.Run(*model, BackToBackJobs("scale_picky", {1, 1, -1, -1, 3, 3}, &buffer));
  EXPECT_GT(second.forward_calls(), 1);
  EXPECT_EQ(*buffer, std::vector<float>({1, 1, -1, -1, 3, 3}));
  EXPECT_EQ(results[1].status.code(), codes::kModelError);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  ASSERT_TRUE(results[2].status.ok()) << results[2].status.ToString();
  EXPECT_EQ(AsFloats(results[0].outputs.at(0)), std::vector<float>({3, 3}));
  EXPECT_EQ(AsFloats(results[2].outputs.at(0)), std::vector<float>({7, 7}));
}

// The registry remembers a model seen writing into its inputs: unloaded to make room and
// loaded again, it still gets copies (its first batch after the reload leaves the jobs' bytes
// as they were), and a failing batch of it is halved, so its good jobs still succeed.
TEST_F(BatcherTest, AReloadedModelThatWritesIntoItsInputsStillGetsCopies) {
  // 1 MiB of parameters, like big_a: a budget of 1.5 MiB holds one of the two.
  ASSERT_TRUE(Load("scale_reloaded",
                   "def forward(self, x):\n"
                   "    x.mul_(2.0)\n"
                   "    assert bool((x >= 0.0).all()), 'negative input'\n"
                   "    return x + 1.0\n",
                   [](torch::jit::Module& m) {
                     m.register_parameter(
                         "w", torch::zeros({testmodels::kBigBytes / 4}, torch::kFloat32), false);
                   }));
  ModelConfig writer;
  writer.name = "scale_reloaded";
  writer.path = (BatcherDir() / "scale_reloaded.pt").string();
  writer.device = "cpu";
  writer.max_batch = 8;
  ModelConfig other = writer;
  other.name = "big_a";
  other.path = testmodels::Path("big_a");
  ModelRegistry::Options budget;
  budget.memory_budget = testmodels::kBigBytes + testmodels::kBigBytes / 2;
  ModelRegistry registry(budget, {writer, other});
  Batcher batcher;
  auto run = [&](const std::vector<float>& values, std::shared_ptr<std::vector<float>>* buffer) {
    ModelRegistry::Lease lease;
    Status s = registry.Acquire("scale_reloaded", &lease);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? batcher.Run(lease.model(), BackToBackJobs("scale_reloaded", values, buffer))
                  : std::vector<JobResult>();
  };

  std::shared_ptr<std::vector<float>> buffer;
  auto results = run({1, 1, 3, 3}, &buffer);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_EQ(*buffer, std::vector<float>({2, 2, 6, 6})) << "read in place: the write was seen";

  ModelRegistry::Lease lease;
  ASSERT_TRUE(registry.Acquire("big_a", &lease).ok());  // unloads scale_reloaded
  lease.Reset();
  ASSERT_FALSE(registry.IsResident("scale_reloaded"));
  EXPECT_EQ(registry.evictions(), 1);

  results = run({1, 1, -1, -1, 3, 3}, &buffer);
  EXPECT_EQ(registry.loads(), 3);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(*buffer, std::vector<float>({1, 1, -1, -1, 3, 3})) << "read in place after a reload";
  EXPECT_EQ(results[1].status.code(), codes::kModelError);
  ASSERT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  ASSERT_TRUE(results[2].status.ok()) << results[2].status.ToString();
  EXPECT_EQ(AsFloats(results[0].outputs.at(0)), std::vector<float>({3, 3}));
  EXPECT_EQ(AsFloats(results[2].outputs.at(0)), std::vector<float>({7, 7}));
}

// A model_error carries the library's first meaningful line, not the TorchScript traceback
// with its source paths; the whole text is in BatchOutput::error_detail, which the batcher logs.
TEST_F(BatcherTest, ModelErrorsCarryTheLibrarysLineNotTheTraceback) {
  auto raises = Load("raises",
                     "def check(self, x):\n"
                     "    assert not bool((x < 0.0).any()), 'negative input: ' + str(x.size(0))\n"
                     "    return x\n"
                     "\n"
                     "def forward(self, x):\n"
                     "    return self.check(x) * 2.0\n");
  const std::string kRaised = "RuntimeError: AssertionError: negative input: 1";
  const Tensor negative = Floats({-1.0f, 1.0f}, {2});
  BatchOutput out;
  std::vector<protocol::TensorRef> args = {Ref(negative)};
  Status s = raises->Run({&args}, &out);
  ASSERT_EQ(s.code(), codes::kModelError);
  EXPECT_EQ(s.message(), kRaised) << s.message();
  // The whole text names the TorchScript frames; the message does not.
  EXPECT_NE(out.error_detail.find("Traceback"), std::string::npos) << out.error_detail;
  EXPECT_NE(out.error_detail.find("negative input"), std::string::npos);

  // An error from an operator inside the interpreter: the operator's line.
  auto linear = Linear();
  const Tensor wrong = Floats({1, 2, 3, 4, 5}, {5});
  args = {Ref(wrong)};
  s = linear->Run({&args}, &out);
  ASSERT_EQ(s.code(), codes::kModelError);
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cannot be multiplied"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("code/"), std::string::npos) << s.message();
  EXPECT_FALSE(out.error_detail.empty());

  // Through the batcher: the job fails alone with the line; its batch-mate succeeds.
  std::vector<Job> jobs;
  jobs.push_back(MakeJob("neg", "raises", {negative}));
  jobs.push_back(MakeJob("pos", "raises", {Floats({1.0f, 2.0f}, {2})}));
  auto results = Batcher().Run(*raises, std::move(jobs));
  EXPECT_EQ(results[0].status.message(), kRaised);
  ASSERT_TRUE(results[1].status.ok()) << results[1].status.ToString();
}

TEST(SummarizeModelErrorTest, TakesTheErrorLineOfATorchScriptTraceback) {
  const std::string traceback =
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n"
      "  File \"code/__torch__/model.py\", line 9, in forward\n"
      "    x: Tensor) -> Tensor:\n"
      "    _0 = torch.matmul(x, self.w)\n"
      "         ~~~~~~~~~~~~ <--- HERE\n"
      "    return _0\n"
      "\n"
      "Traceback of TorchScript, original code (most recent call last):\n"
      "  File \"/home/alice/src/model.py\", line 12, in forward\n"
      "    return torch.matmul(x, self.w)\n"
      "           ~~~~~~~~~~~~ <--- HERE\n"
      "    y = 1\n"
      "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x5 and 8x3)\n"
      "  a detail line\n";
  EXPECT_EQ(SummarizeModelError(traceback),
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x5 and 8x3)");
  EXPECT_EQ(SummarizeModelError("builtins.RuntimeError: nope\n"), "RuntimeError: nope");
  EXPECT_EQ(SummarizeModelError("\n  shape '[2, 3]' is invalid for input of size 5\nmore\n"),
            "shape '[2, 3]' is invalid for input of size 5");
  EXPECT_EQ(SummarizeModelError("one line"), "one line");
  EXPECT_EQ(SummarizeModelError(""), "");
}

TEST_F(BatcherTest, TupleOutputsOfMixedDtypesAreSplitPerJob) {
  auto model = Load("multi", "def forward(self, a, b):\n    return (a * 2.0 + 1.0, b.sum(1))\n");
  std::vector<Job> jobs;
  for (int j = 0; j < 3; ++j) {
    Tensor a = Floats({1.0f * j, 2, 3, 4}, {4});
    Tensor b = Tensor::From<int64_t>({j, 10, 100}, {3}, DType::kInt64);
    jobs.push_back(MakeJob("m" + std::to_string(j), "multi", {a, b}));
  }
  Batcher batcher;
  auto results = batcher.Run(*model, std::move(jobs));
  EXPECT_EQ(batcher.forward_calls(), 1);
  for (int j = 0; j < 3; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    ASSERT_EQ(results[j].outputs.size(), 2u);
    EXPECT_EQ(AsFloats(results[j].outputs[0]), std::vector<float>({2.0f * j + 1, 5, 7, 9}));
    const auto& sum = results[j].outputs[1];
    EXPECT_EQ(sum.dtype, DType::kInt64);
    EXPECT_TRUE(sum.shape.empty());
    ASSERT_EQ(sum.size, sizeof(int64_t));
    int64_t v;
    std::memcpy(&v, sum.data, sizeof(v));
    EXPECT_EQ(v, j + 110);
  }
}

TEST_F(BatcherTest, ListOutputsAreSplitPerJob) {
  auto model = Load("listy", "def forward(self, x):\n    return [x, x + 1.0]\n");
  Batcher batcher;
  auto results = batcher.Run(*model, {MakeJob("a", "listy", {Floats({1, 2}, {2})}),
                                      MakeJob("b", "listy", {Floats({3, 4}, {2})})});
  for (int j = 0; j < 2; ++j) {
    ASSERT_TRUE(results[j].status.ok()) << results[j].status.ToString();
    ASSERT_EQ(results[j].outputs.size(), 2u);
    EXPECT_EQ(AsFloats(results[j].outputs[1]), std::vector<float>({2.0f * j + 2, 2.0f * j + 3}));
  }
}

TEST_F(BatcherTest, EveryDtypeRoundTrips) {
  auto model = Load("identity", "def forward(self, x):\n    return x.clone()\n");
  const DType all[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                       DType::kInt64,   DType::kInt32,   DType::kInt16,    DType::kInt8,
                       DType::kUInt8,   DType::kBool};
  for (DType dtype : all) {
    std::vector<Job> jobs;
    std::vector<std::string> payloads;
    for (int j = 0; j < 3; ++j) {
      Tensor t;
      t.dtype = dtype;
      t.shape = {2, 3};
      t.data.resize(6 * ItemSize(dtype));
      for (size_t i = 0; i < t.data.size(); ++i)  // valid bit patterns for every dtype
        t.data[i] = static_cast<char>(dtype == DType::kBool ? (i + j) % 2 : (i * 7 + j) % 60);
      payloads.push_back(t.data);
      jobs.push_back(MakeJob("d" + std::to_string(j), "identity", {t}));
    }
    Batcher batcher;
    auto results = batcher.Run(*model, std::move(jobs));
    for (int j = 0; j < 3; ++j) {
      ASSERT_TRUE(results[j].status.ok()) << DTypeName(dtype) << results[j].status.ToString();
      const auto& out = results[j].outputs.at(0);
      EXPECT_EQ(out.dtype, dtype) << DTypeName(dtype);
      EXPECT_EQ(out.shape, std::vector<int64_t>({2, 3}));
      EXPECT_EQ(std::string(out.data, out.size), payloads[j]) << DTypeName(dtype);
      EXPECT_EQ(results[j].batch_size, 3);
    }
  }
}

TEST_F(BatcherTest, OutputWithoutBatchDimensionFailsTheBatchOnce) {
  auto model = Load("scalar", "def forward(self, x):\n    return x.sum()\n");
  Batcher batcher;
  auto results = batcher.Run(*model, {MakeJob("a", "scalar", {Floats({1, 2}, {2})}),
                                      MakeJob("b", "scalar", {Floats({3, 4}, {2})})});
  EXPECT_EQ(batcher.forward_calls(), 1);  // no batch size can fix it: no halving
  for (const auto& r : results) {
    EXPECT_EQ(r.status.code(), codes::kModelError);
    EXPECT_NE(r.status.message().find("batch"), std::string::npos) << r.status.message();
    EXPECT_EQ(r.batch_size, 2);
  }
}

TEST_F(BatcherTest, UnencodableOutputsFailWithModelError) {
  auto complex = Load("complex", "def forward(self, x):\n    return torch.view_as_complex(x)\n");
  auto integer = Load("integer", "def forward(self, x):\n    return 3\n");
  Batcher batcher;
  auto r1 = batcher.Run(*complex, {MakeJob("c", "complex", {Floats({1, 2}, {2})})});
  EXPECT_EQ(r1[0].status.code(), codes::kModelError);
  EXPECT_NE(r1[0].status.message().find("dtype"), std::string::npos) << r1[0].status.message();
  auto r2 = batcher.Run(*integer, {MakeJob("i", "integer", {Floats({1, 2}, {2})})});
  EXPECT_EQ(r2[0].status.code(), codes::kModelError);
}

TEST_F(BatcherTest, ExecutorFailsJobsOfAnUnknownModel) {
  ASSERT_TRUE(Linear());  // saves linear.pt
  ModelConfig config;
  config.name = "linear";
  config.path = (BatcherDir() / "linear.pt").string();
  config.device = "cpu";
  config.max_batch = 32;
  ModelRegistry registry(ModelRegistry::Options{}, {config});
  Executor executor(Executor::Options{}, &registry, nullptr, nullptr);
  auto results =
      executor.RunBatch({MakeJob("u1", "nope", {Row(0)}), MakeJob("u2", "nope", {Row(1)})});
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.status.code(), codes::kUnknownModel);
    EXPECT_EQ(r.batch_size, 0);
  }
  auto ok = executor.RunBatch({MakeJob("k", "linear", {Row(0)})});
  EXPECT_TRUE(ok.at(0).status.ok());
}

TEST_F(BatcherTest, ModelCreateReportsBadPathsAndDevices) {
  std::unique_ptr<Model> model;
  Status s = Model::Create("x", "/nonexistent/model.pt", "cpu", &model);
  EXPECT_EQ(s.code(), codes::kInternal);
  EXPECT_NE(s.message().find("/nonexistent/model.pt"), std::string::npos);
  EXPECT_EQ(Model::Create("x", "/nonexistent/model.pt", "tpu", &model).code(),
            codes::kInvalidArgument);
  if (!CudaAvailable()) {  // unavailable: a driver still loading looks the same (main.cc: exit 1)
    EXPECT_EQ(Model::Create("x", "/nonexistent/model.pt", "cuda:0", &model).code(),
              codes::kUnavailable);
  }
}

}  // namespace
}  // namespace ferry::worker
