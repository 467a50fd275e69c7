// Every binary's command line against real processes: --version of each one, the broker's flags
// out of their ranges (exit 2 naming the flag and the range), and binds that fail (exit 1 naming
// the flag and the address).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/metrics/metrics_server.h"
#include "fleet.h"
#include "ops_cli_fixture.h"
#include "process.h"

namespace ferry::testutil::ops_test {
namespace {

// Runs `argv` to completion; returns its exit code and output.
int RunBin(const TempDir& dir, const std::vector<std::string>& argv, std::string* output) {
  static int n = 0;
  Process p(argv, dir.path() + "/bin" + std::to_string(n++) + ".log");
  int rc = p.Wait(seconds(60));
  *output = p.Log();
  return rc;
}

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
      {{"--max-jobs-per-message", "0"}, "--max-jobs-per-message must be 1..65536"},
      {{"--max-jobs-per-message", "65537"}, "--max-jobs-per-message must be 1..65536, got 65537"},
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

// A worker whose READY the broker would refuse (ERROR: it would get no work for ever, its
// /readyz saying ready) stops at start, saying why: a capacity over 65,536 (40,000 x 2), a
// model name the broker does not take. Exit 2, as for a bad flag: the configuration's fault,
// which a restart (systemd's RestartPreventExitStatus=2) would not mend.
TEST(WorkerFlags, AReadyTheBrokerWouldRefuseStopsTheWorkerAtStart) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "tiny=" + ModelPath("tiny"), "--max-batch", "40000", "--instances", "1"},
       "READY \"capacity\" must be 1..65536 (the worker's capacity is the largest max batch"},
      {{"--model", "tiny model=" + ModelPath("tiny")},
       "READY model name \"tiny model\": 1-128 characters of [A-Za-z0-9._:/-]"},
  };
  const std::string name = "refused-worker";
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {WorkerBin(),
                                     "--broker",
                                     "tcp://127.0.0.1:1",
                                     "--redis",
                                     "redis://127.0.0.1:1",
                                     "--device",
                                     "cpu",
                                     "--name",
                                     name};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    EXPECT_EQ(RunBin(dir, argv, &out), 2) << out;
    EXPECT_NE(out.find("the broker would refuse the READY of worker " + name + ": " + message),
              std::string::npos)
        << out;
  }
}

// A CURVE key the worker cannot read exits 2 (not restarted), as in the broker; a device not
// there now exits 1 (restarted: a driver still loading at boot looks the same).
TEST(WorkerFlags, AKeyItCannotReadExits2) {
  if (WorkerBin().empty()) GTEST_SKIP() << "built without ferry-worker (no libtorch)";
  TempDir dir;
  const std::string missing = dir.path() + "/missing.key";
  std::string out;
  EXPECT_EQ(RunBin(dir,
                   {WorkerBin(), "--broker", "tcp://127.0.0.1:1", "--redis", "redis://127.0.0.1:1",
                    "--device", "cpu", "--model", "tiny=" + ModelPath("tiny"),
                    "--curve-server-public", missing, "--curve-secret", missing},
                   &out),
            2)
      << out;
  EXPECT_NE(out.find("cannot read CURVE certificate " + missing), std::string::npos) << out;
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
}  // namespace
}  // namespace ferry::testutil::ops_test
