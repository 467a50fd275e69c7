// The operator commands against real processes: `ferry status` and `ferry top` against a live
// redis-server + ferry-broker (no worker needed), the producer commands' defaults from
// FERRY_FRONTEND / FERRY_REDIS, `ferry get` / `ferry wait` (ids checked, --out-npy, --consume) and
// `ferry models` on a fleet. `ferry up`: ferry_up_test.cc; the binaries' --version, flag ranges
// and bind errors: ops_flags_test.cc.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "fleet.h"
#include "ops_cli_fixture.h"
#include "process.h"

namespace ferry::testutil::ops_test {
namespace {

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

TEST_F(LiveBroker, StatusShowsTablesAndCountersMove) {
  std::string out;
  ASSERT_EQ(RunCli(dir_, {"status", "--frontend", frontend_}, &out), 0) << out;
  EXPECT_NE(out.find("0 worker(s), 0 job(s) pending"), std::string::npos) << out;
  EXPECT_NE(out.find("no workers connected"), std::string::npos) << out;
  EXPECT_NE(out.find("accepted 0  rejected 0  finished 0"), std::string::npos) << out;

  // Three jobs for a model nobody serves: rejected, and `status` says so.
  client::ClientOptions o;
  o.frontend = frontend_;
  o.redis = redis_.url();
  std::unique_ptr<client::Client> c;
  ASSERT_TRUE(client::Client::Create(o, &c).ok());
  for (int i = 0; i < 3; ++i) {
    client::Job job;
    job.model = "nosuch";
    job.inputs.push_back(Tensor::From<float>({1, 2}, {2}, DType::kFloat32));
    EXPECT_EQ(c->Submit(job, nullptr).code(), codes::kUnknownModel);
  }
  ASSERT_EQ(RunCli(dir_, {"status", "--frontend", frontend_}, &out), 0) << out;
  EXPECT_NE(out.find("accepted 0  rejected 3  finished 0"), std::string::npos) << out;
}

TEST_F(LiveBroker, StatusFailsCleanlyWithoutABroker) {
  std::string out;
  std::string nobody = "tcp://127.0.0.1:" + std::to_string(FreePort());
  EXPECT_EQ(RunCli(dir_, {"status", "--frontend", nobody, "--request-timeout-ms", "300"}, &out), 3)
      << out;
  EXPECT_NE(out.find("unavailable"), std::string::npos) << out;
}

// `top` without a tty: N frames, then exit 0. A /metrics endpoint in this process stands in for
// the broker's: each scrape adds latency observations, so every interval has a p50/p99.
TEST_F(LiveBroker, TopPrintsFramesWithRatesAndPercentiles) {
  metrics::Registry registry;
  namespace n = metrics::names;
  auto* latency = registry.Histogram(n::kJobLatency, n::kJobLatencyHelp, n::LatencyBuckets(),
                                     {{n::kLabelModel, "tiny"}});
  metrics::MetricsServerOptions mo;
  mo.port = metrics::kAnyPort;
  mo.bind_address = "127.0.0.1";
  mo.before_scrape = [latency] {
    for (int i = 0; i < 10; ++i) latency->Observe(0.02);
  };
  std::unique_ptr<metrics::MetricsServer> server;
  ASSERT_TRUE(metrics::MetricsServer::Start(&registry, mo, &server).ok());
  std::string url = "http://127.0.0.1:" + std::to_string(server->port()) + "/metrics";

  std::string out;
  ASSERT_EQ(RunCli(dir_,
                   {"top", "--frontend", frontend_, "--iterations", "3", "--interval-ms", "100",
                    "--metrics", url},
                   &out),
            0)
      << out;
  EXPECT_EQ(Count(out, "ferry top  broker " + frontend_), 3) << out;
  EXPECT_EQ(Count(out, "throughput  finished 0.0/s"), 3) << out;
  EXPECT_EQ(Count(out, "p50 -"), 0) << out;
  EXPECT_NE(out.find(" ms  p99 "), std::string::npos) << out;
  EXPECT_EQ(out.find("\033["), std::string::npos) << "no escape codes without a tty";
}

// Sets environment variables for a test's children; restores them when it goes.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::string> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(GetAndWait, InvalidIdsExitTwoWithAMessage) {
  TempDir dir;
  std::string out;
  for (const std::string& id : {std::string("a/b"), std::string("has space"), std::string(129, 'x'),
                                std::string("caf\xc3\xa9")}) {
    for (const char* cmd : {"get", "wait"}) {
      EXPECT_EQ(RunCli(dir, {cmd, id, "--frontend", "tcp://127.0.0.1:1"}, &out), 2)
          << cmd << " " << id << ": " << out;
      EXPECT_NE(out.find("is not a job id: ids are 1-128 characters"), std::string::npos) << out;
    }
  }
}

// Bad --input files and out-of-range numbers exit 2 before anything is sent: a directory (read
// as an empty tensor before), a device file (read whole, without end), a timeout past an int
// (cut to 0 ms before).
TEST(Submit, BadInputsAndOutOfRangeNumbersExitTwo) {
  TempDir dir;
  std::string out;
  const std::vector<std::string> broker = {"--frontend", "tcp://127.0.0.1:1", "--redis",
                                           "redis://127.0.0.1:1"};
  auto submit = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"submit", "--model", "tiny"});
    args.insert(args.end(), broker.begin(), broker.end());
    return RunCli(dir, args, &out);
  };
  EXPECT_EQ(submit({"--input", dir.path()}), 2) << out;
  EXPECT_NE(out.find("\"" + dir.path() + "\" is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(submit({"--input", "/dev/zero"}), 2) << out;
  EXPECT_NE(out.find("\"/dev/zero\" is not a regular file"), std::string::npos) << out;
  EXPECT_EQ(submit({"--input", dir.path() + "/none.npy"}), 2) << out;
  EXPECT_NE(out.find("cannot open"), std::string::npos) << out;
  std::ofstream(dir.path() + "/x.bin") << std::string(32, '\0');
  EXPECT_EQ(submit({"--input", dir.path() + "/x.bin", "--wait", "--wait-timeout-ms", "4294967296"}),
            2)
      << out;
  EXPECT_NE(out.find("--wait-timeout-ms must be -1..2147483647"), std::string::npos) << out;
  EXPECT_EQ(submit({"--input", dir.path() + "/x.bin", "--request-timeout-ms", "3000000000"}), 2)
      << out;
  EXPECT_NE(out.find("--request-timeout-ms must be 1..2147483647"), std::string::npos) << out;
}

// A bad flag prints the usage text, whose defaults come from the environment: a password in
// $FERRY_REDIS shows as *** (a typo in a CI script put it in the CI log). `top` refuses an
// interval past an hour (4294967296 ms was cut to an int: a frame every few microseconds).
TEST(Usage, ShowsNoRedisPasswordAndTopRefusesAnAbsurdInterval) {
  TempDir dir;
  std::string out;
  ScopedEnv env(
      std::map<std::string, std::string>{{"FERRY_REDIS", "redis://app:s3cr3t@127.0.0.1:1"}});
  EXPECT_EQ(RunCli(dir, {"wait", "--nope", "abc"}, &out), 2) << out;
  EXPECT_EQ(out.find("s3cr3t"), std::string::npos) << out;
  EXPECT_NE(out.find("(default: redis://app:***@127.0.0.1:1)"), std::string::npos) << out;
  EXPECT_EQ(
      RunCli(dir, {"top", "--interval-ms", "4294967296", "--frontend", "tcp://127.0.0.1:1"}, &out),
      2)
      << out;
  EXPECT_NE(out.find("--interval-ms 10..3600000"), std::string::npos) << out;
}

// FERRY_FRONTEND / FERRY_REDIS (what `ferry up --env-file` writes) are the producer commands'
// defaults; a flag wins over them.
TEST_F(LiveBroker, EnvironmentGivesTheDefaultsAndFlagsWin) {
  std::string out;
  {
    ScopedEnv env({{"FERRY_FRONTEND", frontend_}, {"FERRY_REDIS", redis_.url()}});
    ASSERT_EQ(RunCli(dir_, {"status"}, &out), 0) << out;
    EXPECT_NE(out.find("0 worker(s)"), std::string::npos) << out;
    ASSERT_EQ(RunCli(dir_, {"stats"}, &out), 0) << out;
    // The flag wins: nobody listens there.
    EXPECT_EQ(RunCli(dir_,
                     {"stats", "--frontend", "tcp://127.0.0.1:" + std::to_string(FreePort()),
                      "--request-timeout-ms", "300"},
                     &out),
              3)
        << out;
    // `get` reads Redis from FERRY_REDIS: an id with no result is pending (exit 4), not a
    // connection error.
    EXPECT_EQ(RunCli(dir_, {"get", "no-such-job"}, &out), 4) << out;
  }
  {
    // FERRY_MAX_MESSAGE_BYTES (the broker's limit, in `ferry up`'s env file when it is not the
    // default): a job over it is too_large before it is sent (sent, it would be unknown_model).
    ScopedEnv env({{"FERRY_FRONTEND", frontend_},
                   {"FERRY_REDIS", redis_.url()},
                   {"FERRY_MAX_MESSAGE_BYTES", "1024"}});
    std::ofstream(dir_.path() + "/x.f32", std::ios::binary)
        .write(std::string(512 * sizeof(float), '\0').data(), 512 * sizeof(float));
    const std::vector<std::string> submit = {
        "submit", "--model", "tiny", "--input", dir_.path() + "/x.f32", "--shape", "512"};
    EXPECT_NE(RunCli(dir_, submit, &out), 0) << out;
    EXPECT_NE(out.find("max_message_bytes"), std::string::npos) << out;
    std::vector<std::string> raised = submit;
    raised.insert(raised.end(), {"--max-message-bytes", "1048576"});  // the flag wins
    EXPECT_NE(RunCli(dir_, raised, &out), 0) << out;
    EXPECT_NE(out.find("unknown_model"), std::string::npos) << out;
  }
  // A FERRY_REDIS that points nowhere: `get` fails unavailable (exit 3).
  ScopedEnv env(std::map<std::string, std::string>{{"FERRY_REDIS", "redis://127.0.0.1:1"}});
  EXPECT_EQ(RunCli(dir_, {"get", "no-such-job", "--request-timeout-ms", "300"}, &out), 3) << out;
  EXPECT_EQ(RunCli(dir_, {"get", "no-such-job", "--redis", redis_.url()}, &out), 4) << out;
}

// `ferry wait --out-npy DIR` creates DIR with its parents; `--consume` deletes the result as it
// is read; a wait on an id this fleet does not know says what that may mean.
TEST(GetAndWait, OutNpyCreatesItsDirectoryAndConsumeDeletes) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  FleetOptions o;
  o.workers = 1;
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  TempDir dir;
  std::ofstream(dir.path() + "/x.f32", std::ios::binary)
      .write(std::string(8 * sizeof(float), '\0').data(), 8 * sizeof(float));
  std::string out;
  const std::vector<std::string> where = {"--frontend", fleet.frontend(), "--redis",
                                          fleet.redis().url()};
  std::vector<std::string> args = {"submit",  "--model", "tiny", "--input", dir.path() + "/x.f32",
                                   "--shape", "8"};
  args.insert(args.end(), where.begin(), where.end());
  ASSERT_EQ(RunCli(dir, args, &out), 0) << out;
  const std::string id = out.substr(0, out.find('\n'));
  const std::string npy_dir = dir.path() + "/out/a/b";
  args = {"wait", id, "--out-npy", npy_dir, "--consume"};
  args.insert(args.end(), where.begin(), where.end());
  ASSERT_EQ(RunCli(dir, args, &out), 0) << out;
  struct stat st {};
  EXPECT_EQ(stat((npy_dir + "/" + id + ".0.npy").c_str(), &st), 0) << out;
  // Consumed: Redis has no result any more.
  args = {"get", id};
  args.insert(args.end(), where.begin(), where.end());
  EXPECT_EQ(RunCli(dir, args, &out), 4) << out;
  EXPECT_NE(out.find("pending"), std::string::npos) << out;

  args = {"wait", "never-submitted", "--timeout-ms", "300"};
  args.insert(args.end(), where.begin(), where.end());
  EXPECT_EQ(RunCli(dir, args, &out), 3) << out;
  EXPECT_NE(out.find("this fleet does not know the id"), std::string::npos) << out;
}

// `ferry models`: each model with the input spec its worker declared (or none) and the worker.
TEST(Models, ListsSpecsAndWorkers) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::string repo = dir.path() + "/models.toml";
  std::ofstream(repo) << "[models.tiny]\npath = \"" << ModelPath("tiny")
                      << "\"\ninputs = [{ name = \"x\", dtype = \"float32\", shape = [8] }]\n";
  FleetOptions o;
  o.workers = 1;
  o.models = {"multi"};  // --model multi=PATH: no spec
  o.worker_args = {"--models", repo};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  std::string out;
  ASSERT_EQ(RunCli(dir, {"models", "--frontend", fleet.frontend()}, &out), 0) << out;
  EXPECT_NE(out.find("broker " + fleet.frontend() + ": 2 model(s)"), std::string::npos) << out;
  const size_t tiny = out.find("\ntiny ");
  ASSERT_NE(tiny, std::string::npos) << out;
  const std::string tiny_row = out.substr(tiny + 1, out.find('\n', tiny + 1) - tiny - 1);
  EXPECT_NE(tiny_row.find("x: float32 [8]"), std::string::npos) << out;
  EXPECT_NE(tiny_row.find(":cpu"), std::string::npos) << out;  // the worker, HOST:PID:cpu
  EXPECT_NE(out.find("\nmulti  (not declared: any inputs)"), std::string::npos) << out;
  EXPECT_EQ(RunCli(dir, {"models", "extra", "--frontend", fleet.frontend()}, &out), 2) << out;
}

}  // namespace
}  // namespace ferry::testutil::ops_test
