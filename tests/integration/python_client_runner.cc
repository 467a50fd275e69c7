// Runs tests/integration/python_client.py -- a client written from docs/protocol.md alone, in
// Python -- against a real fleet, and checks that it finds every result correct.
#include <gtest/gtest.h>

#include "fleet.h"

namespace ferry {
namespace {

TEST(PythonClient, SubmitsAndReadsCorrectResultsFromRedis) {
  testutil::FleetOptions fo{1};
  fo.models = {"tiny", "null"};  // null: a result too big to come inline
  // The client's last check stops reading and counts on FINISHED turning ids-only past this.
  fo.broker_args = {"--max-inline-backlog-bytes", "100000"};
  testutil::Fleet fleet(fo);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  testutil::TempDir dir;
  testutil::Process py({PYTHON3, PYTHON_CLIENT, "--frontend", fleet.frontend(), "--redis",
                        fleet.redis().url(), "--jobs", "200"},
                       dir.path() + "/python.log");
  int rc = py.Wait(std::chrono::seconds(120));
  EXPECT_EQ(rc, 0) << py.Log() << "\n" << fleet.Logs();
}

}  // namespace
}  // namespace ferry
