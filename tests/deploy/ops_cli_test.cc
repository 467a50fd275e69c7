// The operator commands against real processes: `ferry status` and `ferry top` against a live
// redis-server + ferry-broker (no worker needed), and `ferry up` running a job end to end and
// draining on SIGTERM, with CURVE when it binds beyond loopback, and failing (exit 1, the cause
// on the terminal) when a child dies before the fleet is ready or its port is taken.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "fleet.h"
#include "process.h"

namespace ferry::testutil {
namespace {

using std::chrono::seconds;

// Runs `ferry ARGS...` to completion; returns its exit code and output.
int RunCli(const TempDir& dir, const std::vector<std::string>& args, std::string* output) {
  static int n = 0;
  std::vector<std::string> argv = {CliBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, dir.path() + "/cli" + std::to_string(n++) + ".log");
  int rc = p.Wait(seconds(60));
  *output = p.Log();
  return rc;
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

class LiveBroker : public ::testing::Test {
 protected:
  void SetUp() override {
    frontend_ = "tcp://127.0.0.1:" + std::to_string(FreePort());
    broker_ = std::make_unique<Process>(
        std::vector<std::string>{BrokerBin(), "--frontend", frontend_, "--backend",
                                 "tcp://127.0.0.1:" + std::to_string(FreePort()), "--redis",
                                 redis_.url()},
        dir_.path() + "/broker.log");
    ASSERT_TRUE(WaitFor([&] { return CountWorkers(frontend_) == 0; }, seconds(20)))
        << broker_->Log();
  }
  TempDir dir_;
  RedisServer redis_;
  std::string frontend_;
  std::unique_ptr<Process> broker_;
};

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

std::map<std::string, std::string> ReadEnvFile(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// The program name of process `pid`: the base name of its argv[0] (ferry-worker re-executes
// itself through /proc/self/exe, and redis-server rewrites its title, so neither the comm nor
// the exe link says it).
std::string ProgramName(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string argv0;
  std::getline(in, argv0, '\0');
  argv0 = argv0.substr(0, argv0.find(' '));  // "redis-server 127.0.0.1:6379"
  return argv0.substr(argv0.rfind('/') + 1);
}

// The child processes of `parent` (from /proc), by program name -> pid.
std::map<std::string, pid_t> ChildrenOf(pid_t parent) {
  std::map<std::string, pid_t> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses; it ends at the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out[ProgramName(pid)] = pid;
  }
  closedir(proc);
  return out;
}

// Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet).
bool Exited(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z' ||
         stat[close + 2] == 'X';
}

// `ferry up` finds ferry-broker/ferry-worker next to itself (the build tree), starts redis, the
// broker and a CPU worker; a job runs through it; SIGTERM drains everything -- the worker, then
// the broker, then redis, each on its SIGTERM -- and it exits 0.
std::string ReadAll(const std::string& path);

TEST(FerryUp, StartsRunsAJobAndDrainsOnSigterm) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  std::string env_file = dir.path() + "/fleet.env";
  // A stage of the drain SIGKILLs what has not stopped after --drain-timeout-ms: up exiting well
  // within one such timeout says nothing was killed.
  constexpr int kDrainTimeoutS = 60;
  Process up({CliBin(), "up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"),
              "--frontend-port", "0", "--backend-port", "0", "--log-dir", dir.path() + "/logs",
              "--env-file", env_file, "--max-batch", "8", "--drain-timeout-ms",
              std::to_string(kDrainTimeoutS * 1000)},
             dir.path() + "/up.log");
  // Ready: the env file is written once every worker registered.
  ASSERT_TRUE(WaitFor([&] { return ReadEnvFile(env_file).count("FERRY_REDIS") > 0; }, seconds(90)))
      << up.Log();
  auto env = ReadEnvFile(env_file);
  int workers = -1;  // the broker's first answer (-1 only while none comes)
  WaitFor([&] { return (workers = CountWorkers(env["FERRY_FRONTEND"])) >= 0; }, seconds(20));
  EXPECT_EQ(workers, 1) << up.Log();
  // Its children: redis-server, the broker and the worker.
  const std::map<std::string, pid_t> children = ChildrenOf(up.pid());
  ASSERT_EQ(children.size(), 3u) << up.Log();
  const std::vector<std::string> stop_order = {"ferry-worker", "ferry-broker", "redis-server"};
  for (const auto& name : stop_order) ASSERT_EQ(children.count(name), 1u) << name << up.Log();
  // The broker and the worker reach the Redis up started over its socket; producers get TCP.
  for (const char* member : {"ferry-broker", "ferry-worker"}) {
    std::string cmdline = ReadAll("/proc/" + std::to_string(children.at(member)) + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    EXPECT_NE(cmdline.find("--redis unix://" + dir.path() + "/logs/redis.sock"), std::string::npos)
        << member << ": " << cmdline;
  }
  EXPECT_EQ(env["FERRY_REDIS"].rfind("redis://127.0.0.1:", 0), 0u) << env["FERRY_REDIS"];

  // A job through the fleet, with the CLI.
  std::ofstream(dir.path() + "/x.f32", std::ios::binary)
      .write(std::string(8 * sizeof(float), '\0').data(), 8 * sizeof(float));
  std::string out;
  ASSERT_EQ(RunCli(dir,
                   {"submit", "--model", "tiny", "--input", dir.path() + "/x.f32", "--shape", "8",
                    "--wait", "--frontend", env["FERRY_FRONTEND"], "--redis", env["FERRY_REDIS"]},
                   &out),
            0)
      << out << up.Log();
  EXPECT_NE(out.find("done"), std::string::npos) << out;
  ASSERT_EQ(RunCli(dir, {"status", "--frontend", env["FERRY_FRONTEND"]}, &out), 0) << out;
  EXPECT_NE(out.find("1 worker(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("finished 1"), std::string::npos) << out;

  up.Signal(SIGTERM);
  const auto signalled = std::chrono::steady_clock::now();
  // The order they stop in. Later ones are looked at first: one seen exited before an earlier
  // one is seen running stopped first.
  std::string out_of_order;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string exited_later;
        bool all = true;
        for (auto it = stop_order.rbegin(); it != stop_order.rend(); ++it) {
          const bool exited = Exited(children.at(*it));
          if (exited && exited_later.empty()) exited_later = *it;
          if (!exited && !exited_later.empty() && out_of_order.empty())
            out_of_order = exited_later + " stopped before " + *it;
          all = all && exited;
        }
        return all;
      },
      seconds(kDrainTimeoutS)))
      << up.Log();
  EXPECT_EQ(out_of_order, "") << up.Log();
  EXPECT_EQ(up.Wait(seconds(kDrainTimeoutS)), 0) << up.Log();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, seconds(kDrainTimeoutS))
      << "a drain stage timed out: something was SIGKILLed\n"
      << up.Log();
  // Every child it started is gone (reaped).
  for (const auto& [name, pid] : children) EXPECT_NE(kill(pid, 0), 0) << name << " still runs";
  EXPECT_FALSE(
      WaitFor([&] { return !ReadEnvFile(env_file).empty(); }, std::chrono::milliseconds(1)));
}

// The mode bits of a file (-1 when it is missing).
int Mode(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Binding all interfaces turns CURVE on by itself: keys are made (secrets 0600), the env file
// names them (paths, never key material), a job runs with them, and a client whose key is not
// listed -- or that speaks plaintext -- gets nothing accepted.
TEST(FerryUp, BindingBeyondLoopbackUsesCurve) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::string env_file = dir.path() + "/fleet.env", logs = dir.path() + "/logs";
  Process up({CliBin(), "up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"),
              "--bind", "0.0.0.0", "--frontend-port", "0", "--backend-port", "0", "--log-dir", logs,
              "--env-file", env_file, "--max-batch", "8"},
             dir.path() + "/up.log");
  ASSERT_TRUE(WaitFor([&] { return ReadEnvFile(env_file).count("FERRY_REDIS") > 0; }, seconds(90)))
      << up.Log();
  EXPECT_NE(up.Log().find("CURVE on"), std::string::npos) << up.Log();
  auto env = ReadEnvFile(env_file);
  const std::string server_public = env["FERRY_CURVE_SERVER_PUBLIC"];
  const std::string secret = env["FERRY_CURVE_SECRET"];
  EXPECT_EQ(server_public, logs + "/keys/broker.key");
  EXPECT_EQ(secret, logs + "/keys/producer.key_secret");
  EXPECT_EQ(Mode(secret), 0600);
  EXPECT_EQ(Mode(logs + "/keys/broker.key_secret"), 0600);
  EXPECT_EQ(Mode(logs + "/keys/worker0.key_secret"), 0600);
  EXPECT_EQ(Mode(logs + "/keys"), 0700);
  EXPECT_EQ(Mode(logs + "/keys/allow-producers/producer.key"), 0644);
  EXPECT_EQ(Mode(logs + "/keys/allow-workers/worker0.key"), 0644);
  EXPECT_EQ(Mode(logs + "/keys/allow-workers/worker0.key_secret"), -1)
      << "no secrets in allow dirs";
  // The env file holds paths: no line of a secret certificate is in it.
  const std::string env_text = ReadAll(env_file), secret_text = ReadAll(secret);
  const size_t at = secret_text.find("secret-key = \"");
  ASSERT_NE(at, std::string::npos) << secret_text;
  EXPECT_EQ(env_text.find(secret_text.substr(at + 14, 40)), std::string::npos) << env_text;
  // No key material on any child's command line either (ps shows argv).
  for (const auto& [name, pid] : ChildrenOf(up.pid())) {
    const std::string cmdline = ReadAll("/proc/" + std::to_string(pid) + "/cmdline");
    EXPECT_EQ(cmdline.find(secret_text.substr(at + 14, 40)), std::string::npos) << name;
  }

  std::ofstream(dir.path() + "/x.f32", std::ios::binary)
      .write(std::string(8 * sizeof(float), '\0').data(), 8 * sizeof(float));
  const std::vector<std::string> job = {"submit",
                                        "--model",
                                        "tiny",
                                        "--input",
                                        dir.path() + "/x.f32",
                                        "--shape",
                                        "8",
                                        "--frontend",
                                        env["FERRY_FRONTEND"],
                                        "--redis",
                                        env["FERRY_REDIS"],
                                        "--request-timeout-ms",
                                        "3000"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = job;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  std::string out;
  ASSERT_EQ(
      RunCli(dir,
             with({"--wait", "--curve-server-public", server_public, "--curve-secret", secret}),
             &out),
      0)
      << out << up.Log();
  EXPECT_NE(out.find("done"), std::string::npos) << out;

  // A key the broker does not list: refused, and the error says CURVE.
  ASSERT_EQ(RunCli(dir, {"keygen", dir.path() + "/stranger", "s"}, &out), 0) << out;
  EXPECT_EQ(RunCli(dir,
                   with({"--curve-server-public", server_public, "--curve-secret",
                         dir.path() + "/stranger/s.key_secret"}),
                   &out),
            3)
      << out;
  EXPECT_NE(out.find("CURVE"), std::string::npos) << out;
  // Plaintext: no answer at all.
  EXPECT_EQ(RunCli(dir, with({}), &out), 3) << out;
  ASSERT_EQ(RunCli(dir,
                   {"status", "--frontend", env["FERRY_FRONTEND"], "--curve-server-public",
                    server_public, "--curve-secret", secret},
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("accepted 1  rejected 0  finished 1"), std::string::npos) << out;

  up.Signal(SIGTERM);
  EXPECT_EQ(up.Wait(seconds(90)), 0) << up.Log();
}

// A worker that exits before the fleet is ready (its model file is not TorchScript) fails
// `ferry up` at once -- not after --ready-timeout-ms, here far longer than the test's own
// wait -- with exit 1, the worker's exit and its last log lines on the terminal, and no "ready".
TEST(FerryUp, AWorkerThatDiesBeforeReadyFailsItAtOnceWithItsLog) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::string bad = dir.path() + "/bad.pt";
  std::ofstream(bad) << "not a TorchScript file\n";
  Process up({CliBin(), "up", "--cpu-workers", "1", "--model", "tiny=" + bad, "--frontend-port",
              "0", "--backend-port", "0", "--ready-timeout-ms", "3600000"},
             dir.path() + "/up.log");
  ASSERT_EQ(up.Wait(seconds(120)), 1) << up.Log();
  const std::string out = up.Log();
  EXPECT_NE(out.find("worker0 exited with code 1 before the fleet was ready"), std::string::npos)
      << out;
  // The worker's own words, from its log.
  EXPECT_NE(out.find("cannot load model \"tiny\""), std::string::npos) << out;
  EXPECT_EQ(out.find("ferry up: ready"), std::string::npos) << out;
  EXPECT_NE(out.find("logs kept in"), std::string::npos) << out;
}

// A broker that cannot start (it is told to bind an address of no interface here: 192.0.2.1 is
// TEST-NET-1, documentation only) fails `ferry up` at once too, with the broker's log lines.
TEST(FerryUp, ABrokerThatCannotBindFailsItAtOnce) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  Process up(
      {CliBin(), "up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"), "--bind",
       "192.0.2.1", "--frontend-port", "0", "--backend-port", "0", "--ready-timeout-ms", "3600000"},
      dir.path() + "/up.log");
  ASSERT_EQ(up.Wait(seconds(120)), 1) << up.Log();
  const std::string out = up.Log();
  EXPECT_NE(out.find("broker exited with code"), std::string::npos) << out;
  EXPECT_NE(out.find("before the fleet was ready; the last lines of "), std::string::npos) << out;
  EXPECT_EQ(out.find("ferry up: ready"), std::string::npos) << out;
}

// With its frontend port held by another broker, `ferry up` fails (exit 1, naming the flag and
// the address) instead of declaring ready against that broker.
TEST_F(LiveBroker, FerryUpOnATakenFrontendPortFails) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  const std::string port = frontend_.substr(frontend_.rfind(':') + 1);
  std::string out;
  EXPECT_EQ(RunCli(dir_,
                   {"up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"),
                    "--frontend-port", port, "--backend-port", "0"},
                   &out),
            1)
      << out;
  EXPECT_NE(out.find("--frontend-port " + port + ": 127.0.0.1:" + port + " is in use"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("ferry up: ready"), std::string::npos) << out;
  EXPECT_EQ(CountWorkers(frontend_), 0) << "no worker of ours joined the other broker";
}

TEST(FerryUp, AMissingModelFileFailsBeforeAnythingStarts) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunCli(dir, {"up", "--model", "tiny=/nonexistent.pt", "--cpu-workers", "1"}, &out), 2)
      << out;
  EXPECT_NE(out.find("--model tiny=/nonexistent.pt: no such file: /nonexistent.pt"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("starting"), std::string::npos) << out;
}

TEST(FerryUp, UsageErrors) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunCli(dir, {"up"}, &out), 2) << out;
  EXPECT_NE(out.find("needs --model"), std::string::npos) << out;
  std::ofstream(dir.path() + "/x.pt") << "x";
  EXPECT_EQ(
      RunCli(dir, {"up", "--model", "m=" + dir.path() + "/x.pt", "--bin-dir", dir.path()}, &out), 1)
      << out;
  EXPECT_NE(out.find("ferry-broker not found"), std::string::npos) << out;
  EXPECT_EQ(RunCli(dir, {"up", "--model", "m", "--cpu-workers", "1"}, &out), 2) << out;
  EXPECT_NE(out.find("want NAME=PATH.pt"), std::string::npos) << out;
  EXPECT_EQ(RunCli(dir,
                   {"up", "--model", "m=" + dir.path() + "/x.pt", "--frontend-port", "7000",
                    "--backend-port", "7000"},
                   &out),
            2)
      << out;
}

// ---- issue 28: --version, broker flag ranges, bind errors, ids, environment, --out-npy ----------

// Runs `argv` to completion; returns its exit code and output.
int RunBin(const TempDir& dir, const std::vector<std::string>& argv, std::string* output) {
  static int n = 0;
  Process p(argv, dir.path() + "/bin" + std::to_string(n++) + ".log");
  int rc = p.Wait(seconds(60));
  *output = p.Log();
  return rc;
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

TEST(Version, EveryBinaryAnswersIt) {
  TempDir dir;
  std::vector<std::pair<std::string, std::string>> bins = {{"ferry-broker", BrokerBin()},
                                                           {"ferry", CliBin()},
                                                           {"ferry-bench", FERRY_BENCH_BIN},
                                                           {"ferry-floor", FERRY_FLOOR_BIN}};
  if (!WorkerBin().empty()) bins.push_back({"ferry-worker", WorkerBin()});
#ifdef FERRY_MAKE_MODELS_BIN
  bins.push_back({"ferry-make-models", FERRY_MAKE_MODELS_BIN});
#endif
  const std::regex line(R"(^(\S+) \d+\.\d+\.\d+( \(git [^)]+\))?\n$)");
  for (const auto& [name, path] : bins) {
    std::string out;
    EXPECT_EQ(RunBin(dir, {path, "--version"}, &out), 0) << name << ": " << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(out, m, line)) << name << ": \"" << out << "\"";
    EXPECT_EQ(m[1], name) << out;
  }
  // A subcommand answers it too, with the binary's name.
  std::string out;
  EXPECT_EQ(RunBin(dir, {CliBin(), "submit", "--version"}, &out), 0) << out;
  EXPECT_EQ(out.rfind("ferry ", 0), 0u) << out;
}

// Every flag out of its range: exit 2 and a message naming the flag and the allowed range, before
// anything is bound or connected (no Redis here).
TEST(BrokerFlags, OutOfRangeValuesExitTwoNamingTheFlag) {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--heartbeat-ms", "0"}, "--heartbeat-ms must be 10..600000, got 0"},
      {{"--heartbeat-ms", "-5"}, "--heartbeat-ms must be 10..600000, got -5"},
      {{"--liveness", "0"}, "--liveness must be 1..1000, got 0"},
      {{"--result-ttl-s", "-1"}, "--result-ttl-s (at most --max-result-ttl-s) must be 1..604800"},
      {{"--result-ttl-s", "100", "--max-result-ttl-s", "10"}, "must be 1..10, got 100"},
      {{"--max-queue", "0"}, "--max-queue must be 1..1000000000, got 0"},
      {{"--max-attempts", "0"}, "--max-attempts must be 1..1000"},
      {{"--max-job-bytes", "0"}, "--max-job-bytes must be 1.."},
      {{"--max-message-bytes", "10"}, "--max-message-bytes must be 1024.."},
      {{"--max-pending-bytes", "-1"}, "--max-pending-bytes must be 1.."},
      {{"--aging-every", "-1"}, "--aging-every must be 0..1000000"},
      {{"--redis-timeout-ms", "0"}, "--redis-timeout-ms must be 1..600000"},
      {{"--max-jobs-per-message", "0"}, "--max-jobs-per-message must be 1..1000000"},
      {{"--orphan-timeout-s", "-1"}, "--orphan-timeout-s must be 0.."},
      {{"--metrics-port", "70000"}, "--metrics-port must be 0..65535"},
      {{"--frontend", "tcp://127.0.0.1:7001", "--backend", "tcp://127.0.0.1:7001"},
       "--frontend and --backend must differ"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {BrokerBin(), "--redis", "redis://127.0.0.1:1"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    EXPECT_EQ(RunBin(dir, argv, &out), 2) << args[0] << ": " << out;
    EXPECT_NE(out.find(message), std::string::npos) << args[0] << ": " << out;
  }
}

// A bind that fails names the flag and the address: the broker's frontend, backend and
// metrics port, and the worker's metrics port.
TEST_F(LiveBroker, BindErrorsNameTheFlagAndTheAddress) {
  std::string out;
  const std::string free = "tcp://127.0.0.1:" + std::to_string(FreePort());
  EXPECT_EQ(RunBin(dir_,
                   {BrokerBin(), "--frontend", frontend_, "--backend", free, "--redis",
                    redis_.url(), "--no-journal"},
                   &out),
            1)
      << out;
  EXPECT_NE(out.find("--frontend " + frontend_ + ": bind: Address already in use"),
            std::string::npos)
      << out;
  EXPECT_EQ(RunBin(dir_,
                   {BrokerBin(), "--frontend", free, "--backend", "tcp://192.0.2.1:5", "--insecure",
                    "--redis", redis_.url(), "--no-journal"},
                   &out),
            1)
      << out;
  EXPECT_NE(out.find("--backend tcp://192.0.2.1:5: bind:"), std::string::npos) << out;

  // A port some process already listens on, for both metrics servers.
  const int taken = FreePort();
  Process holder({BrokerBin(), "--frontend", free, "--backend",
                  "tcp://127.0.0.1:" + std::to_string(FreePort()), "--redis", redis_.url(),
                  "--no-journal", "--metrics-port", std::to_string(taken)},
                 dir_.path() + "/holder.log");
  std::string body;
  ASSERT_TRUE(WaitFor([&] {
    return metrics::HttpGet("http://127.0.0.1:" + std::to_string(taken) + "/livez", 1000, &body)
        .ok();
  })) << holder.Log();
  EXPECT_EQ(RunBin(dir_,
                   {BrokerBin(), "--frontend", "tcp://127.0.0.1:" + std::to_string(FreePort()),
                    "--backend", "tcp://127.0.0.1:" + std::to_string(FreePort()), "--redis",
                    redis_.url(), "--no-journal", "--metrics-port", std::to_string(taken)},
                   &out),
            1)
      << out;
  EXPECT_NE(out.find("--metrics-addr 127.0.0.1 --metrics-port " + std::to_string(taken)),
            std::string::npos)
      << out;
  if (!WorkerBin().empty()) {
    EXPECT_EQ(
        RunBin(dir_,
               {WorkerBin(), "--broker", "tcp://127.0.0.1:1", "--redis", redis_.url(), "--model",
                "tiny=" + ModelPath("tiny"), "--metrics-port", std::to_string(taken)},
               &out),
        1)
        << out;
    EXPECT_NE(out.find("--metrics-addr 127.0.0.1 --metrics-port " + std::to_string(taken)),
              std::string::npos)
        << out;
  }
}

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
}  // namespace ferry::testutil
