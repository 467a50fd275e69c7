// Redis over its Unix-domain socket (unix:///PATH, for members on Redis's host): the broker, the
// worker and the producer SDK reach Redis through the socket alone, and the whole job path works
// through it -- small jobs with their results in FINISHED and the worker's notices (the SDK's
// subscription), big inputs by claim check (the SDK's SET, the worker's GET and DEL), big
// results written plain and read whole. CLIENT LIST shows who is connected how.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/redis.h"
#include "fleet.h"
#include "process.h"
#include "reference.h"

namespace ferry {
namespace {

using client::Client;
using client::ClientOptions;
using client::Job;
using client::SubmitOutcome;
using testutil::Fleet;
using testutil::FleetOptions;

// CLIENT LIST's `addr=` of every connection but the one asking (over TCP, port()).
std::vector<std::string> OtherClientAddresses(Fleet& fleet) {
  std::vector<std::string> out;
  auto redis = fleet.redis().Connect();
  protocol::RedisReply list, id;
  if (!redis || !redis->Command({"CLIENT", "LIST"}, &list).ok() ||
      !redis->Command({"CLIENT", "ID"}, &id).ok())
    return out;
  std::istringstream lines(list.str);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("id=" + std::to_string(id.integer) + " ", 0) == 0) continue;  // ourselves
    const size_t at = line.find(" addr=");
    if (at == std::string::npos) continue;
    const size_t end = line.find(' ', at + 1);
    out.push_back(line.substr(at + 6, end - at - 6));
  }
  return out;
}

TEST(RedisUnixSocket, TheWholeJobPathGoesThroughTheSocket) {
  FleetOptions o;
  o.workers = 1;
  o.models = {"null"};
  o.max_batch = 4;
  o.redis_unix_socket = true;
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis_url();
  ASSERT_EQ(co.redis.rfind("unix:///", 0), 0u) << co.redis;
  co.curve_server_public = fleet.curve_server_public();  // "" unless FERRY_TEST_CURVE=1
  co.curve_secret = fleet.curve_secret();
  std::unique_ptr<Client> client;
  Status s = Client::Create(co, &client);
  ASSERT_TRUE(s.ok()) << s.ToString();

  // 32 bytes in and out (inside SUBMIT and FINISHED); 400 KB in and out (by claim check, and a
  // result record written plain and read with GET).
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 8; ++i) {
    Job j;
    j.model = "null";
    j.inputs = {testutil::RandomFloats(
        i % 2 == 0 ? std::vector<int64_t>{8} : std::vector<int64_t>{100, 1000}, 700 + i)};
    jobs.push_back(std::move(j));
  }
  std::vector<SubmitOutcome> outcomes;
  s = client->SubmitMany(jobs, &outcomes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.ToString();
    Result r;
    s = client->Wait(outcomes[i].id, 60000, &r);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << fleet.Logs();
    ASSERT_EQ(r.state, JobState::kDone) << r.error.ToString();
    EXPECT_TRUE(r.outputs.at(0).data == jobs[i].inputs[0].data) << i;
  }
  {  // Nothing of the claim check is left behind (deleted in the round after the results).
    auto redis = fleet.redis().Connect();
    ASSERT_NE(redis, nullptr);
    protocol::RedisReply keys;
    EXPECT_TRUE(testutil::WaitFor([&] {
      return redis->Command({"KEYS", "ferry:input:*"}, &keys).ok() && keys.elements.empty();
    })) << keys.elements.size()
        << " input keys left";
  }

  // The broker, the worker and the SDK: all on the socket (Redis names it as their address:
  // "PATH:0", or "[PATH:0]:0" in Valkey 9), none over TCP.
  const std::vector<std::string> addresses = OtherClientAddresses(fleet);
  EXPECT_GE(addresses.size(), 3u);
  const std::string path = fleet.redis().socket_path();
  for (const std::string& a : addresses)
    EXPECT_TRUE(a.rfind(path + ":", 0) == 0 || a.rfind("[" + path + ":", 0) == 0)
        << "a client over TCP: " << a;
}

// A socket nobody listens on is Redis unavailable: the SDK says where, and retries later.
TEST(RedisUnixSocket, NoListenerIsUnavailable) {
  testutil::TempDir dir;
  protocol::RedisEndpoint ep;
  ASSERT_TRUE(protocol::ParseRedisUrl("unix://" + dir.path() + "/none.sock", &ep).ok());
  std::unique_ptr<protocol::RedisClient> c;
  const Status s = protocol::RedisClient::Connect(ep, 1000, &c);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("unix:" + dir.path() + "/none.sock"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace ferry
