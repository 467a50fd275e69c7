// `ferry up` against real processes: it starts redis-server, the broker and a worker, runs a job
// end to end and drains them in order on SIGTERM; it turns CURVE on when it binds beyond
// loopback; it fails (exit 1, the cause on the terminal) when a child dies before the fleet is
// ready or its port is taken, and (exit 2) on usage errors and missing model files.
#include <dirent.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fleet.h"
#include "ops_cli_fixture.h"
#include "process.h"

namespace ferry::testutil::ops_test {
namespace {

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
              std::to_string(kDrainTimeoutS * 1000), "--broker-arg=--max-message-bytes=2097152"},
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
    std::string cmdline = ReadFile("/proc/" + std::to_string(children.at(member)) + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    EXPECT_NE(cmdline.find("--redis unix://" + dir.path() + "/logs/redis.sock"), std::string::npos)
        << member << ": " << cmdline;
  }
  EXPECT_EQ(env["FERRY_REDIS"].rfind("redis://127.0.0.1:", 0), 0u) << env["FERRY_REDIS"];
  EXPECT_EQ(env["FERRY_MAX_MESSAGE_BYTES"], "2097152");  // the broker's limit, for the SDKs

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

// A drain that has to SIGKILL a process (here the worker, stopped, cannot drain within
// --drain-timeout-ms) says so and exits 1: 0 means it drained cleanly. It exited 0.
TEST(FerryUp, ADrainThatHadToKillAProcessExitsOne) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  std::string env_file = dir.path() + "/fleet.env";
  Process up({CliBin(), "up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"),
              "--frontend-port", "0", "--backend-port", "0", "--log-dir", dir.path() + "/logs",
              "--env-file", env_file, "--drain-timeout-ms", "1000"},
             dir.path() + "/up.log");
  ASSERT_TRUE(WaitFor([&] { return ReadEnvFile(env_file).count("FERRY_REDIS") > 0; }, seconds(90)))
      << up.Log();
  const std::map<std::string, pid_t> children = ChildrenOf(up.pid());
  ASSERT_EQ(children.count("ferry-worker"), 1u) << up.Log();
  ASSERT_EQ(kill(children.at("ferry-worker"), SIGSTOP), 0);
  up.Signal(SIGTERM);
  EXPECT_EQ(up.Wait(seconds(60)), 1) << up.Log();
  EXPECT_NE(up.Log().find("some processes had to be killed"), std::string::npos) << up.Log();
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
  EXPECT_EQ(env.count("FERRY_MAX_MESSAGE_BYTES"), 0u);  // the broker's default limit
  EXPECT_EQ(secret, logs + "/keys/producer.key_secret");
  EXPECT_EQ(FileMode(secret), 0600);
  EXPECT_EQ(FileMode(logs + "/keys/broker.key_secret"), 0600);
  EXPECT_EQ(FileMode(logs + "/keys/worker0.key_secret"), 0600);
  EXPECT_EQ(FileMode(logs + "/keys"), 0700);
  EXPECT_EQ(FileMode(logs + "/keys/allow-producers/producer.key"), 0644);
  EXPECT_EQ(FileMode(logs + "/keys/allow-workers/worker0.key"), 0644);
  EXPECT_EQ(FileMode(logs + "/keys/allow-workers/worker0.key_secret"), -1)
      << "no secrets in allow dirs";
  // The env file holds paths: no line of a secret certificate is in it.
  const std::string env_text = ReadFile(env_file), secret_text = ReadFile(secret);
  const size_t at = secret_text.find("secret-key = \"");
  ASSERT_NE(at, std::string::npos) << secret_text;
  EXPECT_EQ(env_text.find(secret_text.substr(at + 14, 40)), std::string::npos) << env_text;
  // No key material on any child's command line either (ps shows argv).
  for (const auto& [name, pid] : ChildrenOf(up.pid())) {
    const std::string cmdline = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
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

// CUDA_VISIBLE_DEVICES=-1 is CUDA's way to hide every GPU: `ferry up` then starts a CPU worker
// (here one that fails at once: its model file is not TorchScript). Before, it started a worker
// on "GPU -1", and "" fell back to every GPU nvidia-smi lists.
TEST(FerryUp, CudaVisibleDevicesMinusOneMeansNoGpu) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::string bad = dir.path() + "/bad.pt";
  std::ofstream(bad) << "not a TorchScript file\n";
  int run = 0;
  for (const char* visible : {"-1", "", " -1,0"}) {
    Process up({"/usr/bin/env", std::string("CUDA_VISIBLE_DEVICES=") + visible, CliBin(), "up",
                "--model", "tiny=" + bad, "--frontend-port", "0", "--backend-port", "0"},
               dir.path() + "/up" + std::to_string(++run) + ".log");
    ASSERT_EQ(up.Wait(seconds(120)), 1) << up.Log();
    const std::string out = up.Log();
    EXPECT_NE(out.find("no GPU visible; starting 1 CPU worker"), std::string::npos)
        << "CUDA_VISIBLE_DEVICES='" << visible << "': " << out;
    EXPECT_EQ(out.find("CUDA_VISIBLE_DEVICES=-1"), std::string::npos) << out;
  }
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
  // The env file of the fleet already there (another `ferry up`'s): this one, failing, must
  // not remove it.
  const std::string env_file = dir_.path() + "/running.env";
  std::ofstream(env_file) << "FERRY_FRONTEND=" << frontend_ << "\n";
  std::string out;
  EXPECT_EQ(RunCli(dir_,
                   {"up", "--cpu-workers", "1", "--model", "tiny=" + ModelPath("tiny"),
                    "--frontend-port", port, "--backend-port", "0", "--env-file", env_file},
                   &out),
            1)
      << out;
  EXPECT_TRUE(std::filesystem::exists(env_file)) << "a run that never wrote it removed it";
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
  // Numbers out of range: before, -1 CPU workers started none and said ready, and a timeout
  // past an int went negative.
  std::vector<std::pair<std::vector<std::string>, std::string>> ranges = {
      {{"--cpu-workers", "-1"}, "--cpu-workers must be 0..1024"},
      {{"--ready-timeout-ms", "3000000000"}, "must be 1..2147483647"},
      {{"--drain-timeout-ms", "3000000000"}, "must be 1..2147483647"},
      {{"--frontend-port", "70000"}, "--frontend-port must be 0..65535"},
      {{"--metrics-port-base", "-5"}, "--metrics-port-base must be 0..65535"},
  };
  // Checked once the workers are known, after the binaries are found (the sanitized build has
  // no ferry-worker).
  if (!WorkerBin().empty())
    ranges.push_back({{"--metrics-port-base", "65535", "--cpu-workers", "2"},
                      "--metrics-port-base 65535 leaves no port for worker 1"});
  for (const auto& [args, message] : ranges) {
    std::vector<std::string> argv = {"up", "--model", "m=" + dir.path() + "/x.pt"};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_EQ(RunCli(dir, argv, &out), 2) << args[0] << ": " << out;
    EXPECT_NE(out.find(message), std::string::npos) << args[0] << ": " << out;
  }
}
}  // namespace
}  // namespace ferry::testutil::ops_test
