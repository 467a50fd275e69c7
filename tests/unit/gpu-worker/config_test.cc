// The model repository file (every field, and bad files with clear errors), byte sizes, the
// padding arithmetic and the out-of-memory batch limit. Torch-free.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "batch_limit.h"
#include "ferry/worker/model_config.h"
#include "padding.h"

namespace ferry::worker {
namespace {

constexpr const char* kFull = R"(
# A ResNet fed uint8 pixels, and a Whisper-tiny-sized encoder fed log-mel frames.
[models.resnet50]
path = "/models/resnet50.pt"
device = "cuda:0"
max_batch = 64
half = true
pinned = true
copy_inputs = true
load = "eager"
[[models.resnet50.convert]]
input = 0
to = "float32"
scale = 0.00392156862745098
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
channel_dim = 0
[models.resnet50.warmup]
inputs = [{ dtype = "uint8", shape = [3, 224, 224] }]
batch_sizes = [1, 16, 64]
iterations = 3

[models.whisper_encoder]
path = "/models/whisper_tiny_encoder.pt"
method = "encode"
load = "lazy"
[models.whisper_encoder.padding]
inputs = [0]
dim = 1
value = 0.0
buckets = [1000, 2000, 3000]
lengths = true
trim = [{ output = 0, dim = 0, ratio = 0.5 }]
)";

TEST(RepositoryTest, ParsesEveryField) {
  std::vector<ModelConfig> models;
  Status s = ParseModelRepositoryText(kFull, "models.toml", &models);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(models.size(), 2u);
  const ModelConfig& r = models[0].name == "resnet50" ? models[0] : models[1];
  const ModelConfig& w = models[0].name == "resnet50" ? models[1] : models[0];
  EXPECT_EQ(r.path, "/models/resnet50.pt");
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_EQ(r.max_batch, 64);
  EXPECT_EQ(r.method, "forward");
  EXPECT_TRUE(r.half);
  EXPECT_TRUE(r.pinned);
  EXPECT_TRUE(r.copy_inputs);
  EXPECT_FALSE(w.copy_inputs);
  EXPECT_EQ(r.load, LoadPolicy::kEager);
  ASSERT_EQ(r.convert.size(), 1u);
  EXPECT_EQ(r.convert[0].to, DType::kFloat32);
  EXPECT_NEAR(r.convert[0].scale, 1 / 255.0, 1e-12);
  EXPECT_EQ(r.convert[0].mean.size(), 3u);
  ASSERT_EQ(r.warmup.inputs.size(), 1u);
  EXPECT_EQ(r.warmup.inputs[0].dtype, DType::kUInt8);
  EXPECT_EQ(r.warmup.inputs[0].shape, std::vector<int64_t>({3, 224, 224}));
  EXPECT_EQ(r.warmup.batch_sizes, std::vector<int64_t>({1, 16, 64}));
  EXPECT_EQ(r.warmup.iterations, 3);
  EXPECT_FALSE(r.padding.enabled());

  EXPECT_EQ(w.method, "encode");
  EXPECT_EQ(w.device, "");    // the worker's --device
  EXPECT_EQ(w.max_batch, 0);  // the worker's --max-batch
  EXPECT_EQ(w.load, LoadPolicy::kLazy);
  EXPECT_EQ(w.padding.inputs, std::vector<size_t>({0}));
  EXPECT_EQ(w.padding.dim, 1);
  EXPECT_EQ(w.padding.buckets, std::vector<int64_t>({1000, 2000, 3000}));
  EXPECT_TRUE(w.padding.pass_lengths);
  ASSERT_EQ(w.padding.trim.size(), 1u);
  EXPECT_DOUBLE_EQ(w.padding.trim[0].ratio, 0.5);
}

TEST(RepositoryTest, ReadsAFile) {
  const auto path = std::filesystem::path(::testing::TempDir()) / "ferry_models_test.toml";
  std::ofstream(path) << "[models.tiny]\npath = \"/m/tiny.pt\"\n";
  std::vector<ModelConfig> models;
  ASSERT_TRUE(ParseModelRepository(path.string(), &models).ok());
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name, "tiny");
  EXPECT_EQ(models[0].load, LoadPolicy::kEager);
  Status s = ParseModelRepository("/nonexistent/models.toml", &models);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("/nonexistent/models.toml"), std::string::npos);
}

TEST(RepositoryTest, BadFilesFailWithFileLineAndKey) {
  struct Case {
    const char* text;
    const char* expect;  // a piece of the message
  };
  const Case cases[] = {
      {"[models.a]\npath = \"a.pt\"\nmax_batch = \"big\"\n",
       "t.toml:3: models.a.max_batch: must be an integer"},
      {"[models.a]\npath = \"a.pt\"\nmaxbatch = 4\n", "models.a.maxbatch: unknown key"},
      {"[models.a]\npath = \"a.pt\"\nmax_batch = 0\n",
       "t.toml:3: models.a.max_batch: must be 1..65536"},
      // A pad value the padded input's dtype cannot hold (before: every job failed at run
      // time, or -1.5 was cut to -1).
      {"[models.a]\npath = \"a.pt\"\ninputs = [{ dtype = \"uint8\", shape = [-1] }]\n"
       "[models.a.padding]\ninputs = [0]\nvalue = 300.0\n",
       "padding.value 300.000000 does not fit input 0 (uint8): want a whole number 0..255"},
      {"[models.a]\npath = \"a.pt\"\ninputs = [{ dtype = \"int16\", shape = [-1] }]\n"
       "[models.a.padding]\ninputs = [0]\nvalue = -1.5\n",
       "padding.value -1.500000 does not fit input 0 (int16)"},
      {"[models.a]\ndevice = \"cpu\"\n", "models.a.path: missing"},
      {"[models.a]\npath = \"a.pt\"\nload = \"sometimes\"\n", "must be \"eager\" or \"lazy\""},
      {"[models.a]\npath = \"a.pt\"\n[models.a.padding]\nbuckets = [8, 4]\n", "strictly ascending"},
      {"[models.a]\npath = \"a.pt\"\n[models.a.padding]\ninputs = [0]\nlength = true\n",
       "models.a.padding.length: unknown key"},
      {"[models.a]\npath = \"a.pt\"\nconvert = [{ input = 0, to = \"int8\", scale = 0.5 }]\n",
       "floating"},
      {"[models.a]\npath = \"a.pt\"\nconvert = [{ input = 0, to = \"float33\" }]\n",
       "unknown dtype"},
      {"[models.a]\npath = \"a.pt\"\nconvert = [{ input = 0, mean = [1.0], std = [] }]\n",
       "same length"},
      {"[models.a]\npath = \"a.pt\"\n[models.a.warmup]\ninputs = [{ dtype = \"uint8\" }]\n",
       "models.a.warmup.inputs[0].shape: missing"},
      {"[models.a]\npath = \"a.pt\"\nhalf = 1\n", "must be true or false"},
      {"[models.a]\npath = \"a.pt\"\n[models.a.padding]\ntrim = [{ output = 0, ratio = 0 }]\n",
       "ratio must be > 0"},
      {"[model.a]\npath = \"a.pt\"\n", "model: unknown key"},
      {"# nothing\n", "at least one [models.NAME]"},
      {"[models.a]\npath = \"a.pt\"\npath = \"b.pt\"\n", "t.toml:3"},  // TOML syntax error
      {"[models]\na = 3\n", "models.a: must be a table"},
  };
  for (const Case& c : cases) {
    std::vector<ModelConfig> models;
    Status s = ParseModelRepositoryText(c.text, "t.toml", &models);
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << c.text;
    EXPECT_NE(s.message().find(c.expect), std::string::npos)
        << "message: " << s.message() << "\nwanted: " << c.expect;
  }
}

TEST(RepositoryTest, InputSpecs) {
  const char* text = R"(
[models.asr]
path = "/m/asr.pt"
inputs = [{ name = "pcm", dtype = "int16", shape = [-1] }]

[models.pair]
path = "/m/pair.pt"
[[models.pair.inputs]]
dtype = "float32"
shape = [-1, 80]
[[models.pair.inputs]]
name = "lengths"
dtype = "int64"
shape = []

[models.free]
path = "/m/free.pt"
)";
  std::vector<ModelConfig> models;
  Status s = ParseModelRepositoryText(text, "m.toml", &models);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::map<std::string, const ModelConfig*> by_name;
  for (const auto& m : models) by_name[m.name] = &m;
  const auto& asr = *by_name.at("asr");
  ASSERT_TRUE(asr.inputs.has_value());
  ASSERT_EQ(asr.inputs->size(), 1u);
  EXPECT_EQ((*asr.inputs)[0].name, "pcm");
  EXPECT_EQ((*asr.inputs)[0].dtype, DType::kInt16);
  EXPECT_EQ((*asr.inputs)[0].shape, std::vector<int64_t>({-1}));
  const auto& pair = *by_name.at("pair");
  ASSERT_TRUE(pair.inputs.has_value());
  ASSERT_EQ(pair.inputs->size(), 2u);
  EXPECT_EQ((*pair.inputs)[0].name, "");
  EXPECT_EQ((*pair.inputs)[0].shape, std::vector<int64_t>({-1, 80}));
  EXPECT_EQ((*pair.inputs)[1].dtype, DType::kInt64);
  EXPECT_TRUE((*pair.inputs)[1].shape.empty());          // a scalar per job
  EXPECT_FALSE(by_name.at("free")->inputs.has_value());  // no spec: anything goes

  const std::string head = "[models.a]\npath = \"a.pt\"\n";
  const std::string u8 = "inputs = [{ dtype = \"uint8\", shape = [3, 4] }]\n";
  struct Case {
    std::string text;
    const char* expect;
  };
  const Case cases[] = {
      {head + "inputs = [{ dtype = \"float33\", shape = [1] }]\n", "unknown dtype \"float33\""},
      {head + "inputs = [{ shape = [1] }]\n", "models.a.inputs[0].dtype: missing"},
      {head + "inputs = [{ dtype = \"uint8\" }]\n", "models.a.inputs[0].shape: missing"},
      {head + "inputs = [{ dtype = \"uint8\", shape = [-2] }]\n", "-1 for any size"},
      {head + "inputs = [{ dtype = \"uint8\", shape = [1.5] }]\n", "array of integers"},
      {head + "inputs = [{ dtype = \"uint8\", shape = [1], size = 3 }]\n",
       "models.a.inputs[0].size: unknown key"},
      {head + "inputs = [{ name = \"a b\", dtype = \"uint8\", shape = [1] }]\n", "[A-Za-z0-9._-]"},
      {head + "inputs = [{ dtype = \"uint8\", shape = [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1] }]\n",
       "at most 16 dims"},
      {head + "inputs = { dtype = \"uint8\", shape = [1] }\n", "models.a.inputs: must be an array"},
      {head + u8 + "convert = [{ input = 1, to = \"float32\" }]\n", "convert names input 1"},
      {head + u8 + "[models.a.warmup]\ninputs = [{ dtype = \"float32\", shape = [3, 4] }]\n",
       "differs from inputs[0] in dtype or rank"},
      {head + u8 + "[models.a.padding]\ninputs = [1]\n", "padding names input 1"},
  };
  for (const Case& c : cases) {
    s = ParseModelRepositoryText(c.text, "t.toml", &models);
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << c.text;
    EXPECT_NE(s.message().find(c.expect), std::string::npos)
        << "message: " << s.message() << "\nwanted: " << c.expect;
  }
  // 65 inputs: more than a job may carry.
  std::string many = head + "inputs = [";
  for (int i = 0; i < 65; ++i)
    many += std::string(i ? ", " : "") + "{ dtype = \"uint8\", shape = [] }";
  s = ParseModelRepositoryText(many + "]\n", "t.toml", &models);
  EXPECT_NE(s.message().find("at most 64 inputs"), std::string::npos) << s.message();
  // A warmup with a fixed size where the spec says -1 agrees with it.
  s = ParseModelRepositoryText(head + "inputs = [{ dtype = \"float32\", shape = [-1, 80] }]\n" +
                                   "[models.a.warmup]\n" +
                                   "inputs = [{ dtype = \"float32\", shape = [3000, 80] }]\n",
                               "t.toml", &models);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(RepositoryTest, ByteSizes) {
  int64_t v = 0;
  ASSERT_TRUE(ParseByteSize("1048576", &v).ok());
  EXPECT_EQ(v, 1048576);
  ASSERT_TRUE(ParseByteSize("512M", &v).ok());
  EXPECT_EQ(v, 512LL << 20);
  ASSERT_TRUE(ParseByteSize("2G", &v).ok());
  EXPECT_EQ(v, 2LL << 30);
  ASSERT_TRUE(ParseByteSize("1.5GiB", &v).ok());
  EXPECT_EQ(v, 3LL << 29);
  ASSERT_TRUE(ParseByteSize("64kb", &v).ok());
  EXPECT_EQ(v, 64 << 10);
  ASSERT_TRUE(ParseByteSize("0", &v).ok());
  EXPECT_EQ(v, 0);
  for (const char* bad : {"", "G", "-1G", "2X", "12 G", "lots"})
    EXPECT_EQ(ParseByteSize(bad, &v).code(), codes::kInvalidArgument) << bad;
}

protocol::TensorRef Ref(std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
  return {dtype, std::move(shape), nullptr, 0};
}

TEST(PaddingTest, GroupKeysLengthsAndBuckets) {
  Padding none;
  EXPECT_NE(none.GroupKey({Ref({3, 4})}), none.GroupKey({Ref({5, 4})}));
  EXPECT_EQ(none.GroupKey({Ref({3, 4})}), none.GroupKey({Ref({3, 4})}));

  PaddingPolicy longest;
  longest.inputs = {0, 1};
  longest.dim = -1;
  Padding p(longest);
  std::vector<protocol::TensorRef> a = {Ref({80, 300}), Ref({300}, DType::kInt64)};
  std::vector<protocol::TensorRef> b = {Ref({80, 120}), Ref({120}, DType::kInt64)};
  EXPECT_TRUE(p.Check(a).ok());
  EXPECT_EQ(p.Length(a), 300);
  EXPECT_EQ(p.GroupKey(a), p.GroupKey(b));
  EXPECT_NE(p.GroupKey(a), p.GroupKey({Ref({64, 300}), Ref({300}, DType::kInt64)}));
  EXPECT_EQ(p.Target(300), 300);
  EXPECT_EQ(p.Check({Ref({80, 300}), Ref({299}, DType::kInt64)}).code(), codes::kInvalidArgument);
  EXPECT_EQ(p.Check({Ref({80, 300})}).code(), codes::kInvalidArgument);  // input 1 missing

  PaddingPolicy bucketed = longest;
  bucketed.inputs = {0};
  bucketed.buckets = {128, 256};
  Padding q(bucketed);
  EXPECT_EQ(q.Bucket(100), 128);
  EXPECT_EQ(q.Bucket(128), 128);
  EXPECT_EQ(q.Bucket(129), 256);
  EXPECT_EQ(q.Bucket(300), 300);  // beyond the last bucket: its own length
  EXPECT_EQ(q.GroupKey({Ref({80, 100})}), q.GroupKey({Ref({80, 120})}));
  EXPECT_NE(q.GroupKey({Ref({80, 100})}), q.GroupKey({Ref({80, 200})}));
  EXPECT_EQ(Padding::Trimmed({0, 0, 0.5}, 3001), 1501);
  EXPECT_EQ(Padding::Trimmed({0, 0, 0.5}, 3000), 1500);
  EXPECT_EQ(Padding::Normalize(-1, 2), 1);
  EXPECT_EQ(Padding::Normalize(2, 2), -1);
}

// Without `inputs` in the config the pad value cannot be checked at load: a job whose padded
// input's dtype it does not fit fails invalid_argument alone. Before, -1 padded uint8 jobs
// with 255 and 0.5 int16 jobs with 0.
TEST(PaddingTest, APadValueThatDoesNotFitAJobsDtypeFailsTheJob) {
  PaddingPolicy policy;
  policy.inputs = {0};
  policy.dim = -1;
  policy.value = -1;
  Padding p(policy);
  EXPECT_TRUE(p.Check({Ref({300})}).ok());
  EXPECT_TRUE(p.Check({Ref({300}, DType::kInt16)}).ok());
  const Status s = p.Check({Ref({300}, DType::kUInt8)});
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "padding.value -1.000000 does not fit input 0 (uint8): want a whole number 0..255");
  policy.value = 0.5;
  EXPECT_EQ(Padding(policy).Check({Ref({300}, DType::kInt16)}).code(), codes::kInvalidArgument);
  EXPECT_TRUE(Padding(policy).Check({Ref({300}, DType::kFloat16)}).ok());
}

TEST(BatchLimitTest, LowersOnOutOfMemoryAndRestoresGradually) {
  BatchLimit limit(64, /*hold_us=*/1000, /*step_us=*/100);
  EXPECT_EQ(limit.Current(0), 64);
  EXPECT_EQ(limit.LowerTo(32, 10), 32);
  EXPECT_EQ(limit.LowerTo(16, 20), 16);
  EXPECT_EQ(limit.LowerTo(32, 30), 16);  // a stale bigger batch never raises it
  EXPECT_EQ(limit.Current(500), 16);     // held
  EXPECT_EQ(limit.Current(1030), 32);    // then doubles every step
  EXPECT_EQ(limit.Current(1130), 64);
  EXPECT_EQ(limit.Current(99999), 64);  // never above the maximum
  BatchLimit one(1);
  EXPECT_EQ(one.LowerTo(0, 0), 1);  // never below 1
}

}  // namespace
}  // namespace ferry::worker
