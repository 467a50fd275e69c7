// ferry-worker's flags: defaults, derived values, and every kind of bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ferry/worker/options.h"

namespace ferry::worker {
namespace {

Status Parse(std::vector<std::string> args, WorkerOptions* o, bool* help = nullptr) {
  args.insert(args.begin(), "ferry-worker");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool h = false;
  std::string usage;
  Status s = ParseWorkerFlags(static_cast<int>(argv.size()), argv.data(), o, &h, &usage);
  if (help) *help = h;
  EXPECT_NE(usage.find("--max-batch"), std::string::npos);
  return s;
}

TEST(WorkerOptionsTest, DefaultsAndDerivedValues) {
  WorkerOptions o;
  ASSERT_TRUE(Parse({"--model", "tiny=/m/tiny.pt"}, &o).ok());
  EXPECT_EQ(o.broker, "tcp://127.0.0.1:5556");
  EXPECT_EQ(o.redis, "redis://127.0.0.1:6379");
  ASSERT_EQ(o.models.size(), 1u);
  EXPECT_EQ(o.models[0].name, "tiny");
  EXPECT_EQ(o.models[0].path, "/m/tiny.pt");
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(o.max_batch, 32);
  EXPECT_EQ(o.instances, 1);
  EXPECT_GE(o.threads, 1);
  EXPECT_EQ(o.redis_prefix, "ferry:");
  EXPECT_EQ(o.heartbeat_ms, 1000);
  EXPECT_EQ(o.result_ttl_s, 600);
  EXPECT_EQ(o.log_level, "info");
  EXPECT_FALSE(o.flush_denormals);
  EXPECT_NE(o.name.find(":cpu"), std::string::npos);
  EXPECT_EQ(o.capacity(), 64);
}

TEST(WorkerOptionsTest, EveryFlag) {
  WorkerOptions o;
  ASSERT_TRUE(Parse({"--broker",
                     "tcp://b:1",
                     "--redis=redis://r:2/3",
                     "--model",
                     "a=a.pt",
                     "--model",
                     "b=b.pt",
                     "--device",
                     "cuda:1",
                     "--max-batch",
                     "8",
                     "--instances",
                     "3",
                     "--threads",
                     "2",
                     "--redis-prefix",
                     "x:",
                     "--name",
                     "w1",
                     "--heartbeat-ms",
                     "250",
                     "--result-ttl-s",
                     "60",
                     "--log-level",
                     "debug",
                     "--flush-denormals"},
                    &o)
                  .ok());
  EXPECT_EQ(o.broker, "tcp://b:1");
  EXPECT_EQ(o.redis, "redis://r:2/3");
  EXPECT_EQ(o.models.size(), 2u);
  EXPECT_EQ(o.device, "cuda:1");
  EXPECT_EQ(o.capacity(), 8 * 4);
  EXPECT_EQ(o.threads, 2);
  EXPECT_EQ(o.redis_prefix, "x:");
  EXPECT_EQ(o.name, "w1");
  EXPECT_EQ(o.heartbeat_ms, 250);
  EXPECT_EQ(o.result_ttl_s, 60);
  EXPECT_TRUE(o.flush_denormals);
}

TEST(WorkerOptionsTest, BadInputIsRejected) {
  const std::vector<std::vector<std::string>> bad = {
      {},  // no model
      {"--model", "noequals"},
      {"--model", "=x.pt"},
      {"--model", "a=a.pt", "--model", "a=b.pt"},  // twice
      {"--model", "a=a.pt", "--device", "gpu"},
      {"--model", "a=a.pt", "--device", "cuda:x"},
      {"--model", "a=a.pt", "--max-batch", "0"},
      {"--model", "a=a.pt", "--max-batch", "ten"},
      {"--model", "a=a.pt", "--instances", "0"},
      {"--model", "a=a.pt", "--redis", "redis://h:notaport"},
      {"--model", "a=a.pt", "--log-level", "loud"},
      {"--model", "a=a.pt", "--bogus", "1"},
      {"--model", "a=a.pt", "stray"},
      {"--model"},
  };
  for (const auto& args : bad) {
    WorkerOptions o;
    Status s = Parse(args, &o);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(s.code(), codes::kInvalidArgument) << joined;
  }
}

TEST(WorkerOptionsTest, RepositoryFileAndShorthandsTogether) {
  const auto path = std::filesystem::path(::testing::TempDir()) / "ferry_options_models.toml";
  std::ofstream(path) << "[models.enc]\npath = \"/m/enc.pt\"\nmax_batch = 128\nload = \"lazy\"\n"
                         "[models.gpu]\npath = \"/m/gpu.pt\"\ndevice = \"cuda:1\"\n";
  WorkerOptions o;
  Status s = Parse({"--models", path.string(), "--model", "tiny=/m/tiny.pt", "--max-batch", "16",
                    "--memory-budget", "1.5G", "--instances", "2"},
                   &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(o.models.size(), 3u);
  EXPECT_EQ(o.memory_budget, 3LL << 29);
  for (const auto& m : o.models) {
    if (m.name == "enc") {
      EXPECT_EQ(m.max_batch, 128);
      EXPECT_EQ(m.device, "cpu");
      EXPECT_EQ(m.load, LoadPolicy::kLazy);
    } else if (m.name == "gpu") {
      EXPECT_EQ(m.device, "cuda:1");
      EXPECT_EQ(m.max_batch, 16);
    } else {
      EXPECT_EQ(m.name, "tiny");
      EXPECT_EQ(m.max_batch, 16);
      EXPECT_EQ(m.load, LoadPolicy::kEager);
    }
  }
  EXPECT_EQ(o.capacity(), 128 * 3);  // the largest max batch x (instances + 1)

  WorkerOptions dup;
  EXPECT_EQ(Parse({"--models", path.string(), "--model", "enc=/x.pt"}, &dup).code(),
            codes::kInvalidArgument);
  WorkerOptions missing;
  s = Parse({"--models", "/nonexistent.toml"}, &missing);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  WorkerOptions budget;
  EXPECT_EQ(Parse({"--model", "a=a.pt", "--memory-budget", "lots"}, &budget).code(),
            codes::kInvalidArgument);
  std::ofstream(path) << "[models.h]\npath = \"/m/h.pt\"\nhalf = true\n";
  WorkerOptions half;
  s = Parse({"--models", path.string()}, &half);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("half"), std::string::npos);
}

TEST(WorkerOptionsTest, Help) {
  WorkerOptions o;
  bool help = false;
  EXPECT_TRUE(Parse({"--help"}, &o, &help).ok());
  EXPECT_TRUE(help);
}

}  // namespace
}  // namespace ferry::worker
