#pragma once
// What the operator-command tests share (ops_cli_test.cc, ferry_up_test.cc, ops_flags_test.cc):
// running `ferry ARGS...` to completion, and the LiveBroker fixture -- a redis-server and a
// ferry-broker on free ports, no worker.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fleet.h"
#include "process.h"

namespace ferry::testutil::ops_test {

using std::chrono::seconds;

// Runs `ferry ARGS...` to completion; returns its exit code and output.
inline int RunCli(const TempDir& dir, const std::vector<std::string>& args, std::string* output) {
  static int n = 0;
  std::vector<std::string> argv = {CliBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, dir.path() + "/cli" + std::to_string(n++) + ".log");
  int rc = p.Wait(seconds(60));
  *output = p.Log();
  return rc;
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

}  // namespace ferry::testutil::ops_test
