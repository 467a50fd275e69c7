// Jobs that end in the broker turn they are accepted in: a SUBMIT and its CANCEL read in one
// turn (the broker is stopped while both reach its socket), with Redis up and down. What the
// producer is told (ACCEPTED, CANCELLED), what the broker counts (/metrics), and what Redis
// holds after.
#include <gtest/gtest.h>

#include <csignal>
#include <functional>

#include "ferry/client.h"
#include "ferry/metrics/names.h"
#include "ferry/protocol/keys.h"
#include "fleet.h"
#include "metrics_scraper.h"
#include "raw_wire.h"

namespace ferry {
namespace {

namespace names = metrics::names;
using client::Client;
using client::ClientOptions;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::Scraper;
using testutil::TinyJob;
using testutil::Url;

// Sends a SUBMIT of one `tiny` job `id` and a CANCEL of it over `s` while the broker is stopped
// (SIGSTOP), so that it reads both in one turn; `while_stopped` runs meanwhile. Reads the
// ACCEPTED and the CANCELLED.
void SubmitAndCancelInOneTurn(Fleet& fleet, zmq::socket_t& s, const std::string& id,
                              protocol::Accepted* accepted, protocol::Cancelled* cancelled,
                              const std::function<void()>& while_stopped = {}) {
  msgpack::sbuffer submit;
  protocol::Packer pk(submit);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  protocol::PackSubmitJob(pk, id, "tiny", {testutil::RandomFloats({8}, 7)}, 0, 0, 0);
  const zmq::message_t cancel = protocol::EncodeIds({id}, 2);
  const std::vector<std::string> messages[] = {
      {"FERRY1", "SUBMIT", std::string(submit.data(), submit.size())},
      {"FERRY1", "CANCEL", std::string(static_cast<const char*>(cancel.data()), cancel.size())}};
  fleet.broker().Signal(SIGSTOP);
  ASSERT_TRUE(testutil::WaitUntilStopped(fleet.broker().pid())) << "the broker did not stop";
  if (while_stopped) while_stopped();
  const size_t before = testutil::UnreadBytes(fleet.frontend());
  for (const auto& frames : messages) testutil::RawSend(s, frames);
  ASSERT_TRUE(testutil::WaitUntilUnread(
      fleet.frontend(), before,
      testutil::WireBytes(messages[0]) + testutil::WireBytes(messages[1])))
      << "the SUBMIT and the CANCEL did not reach the broker's socket";
  fleet.broker().Signal(SIGCONT);
  bool got_accepted = false, got_cancelled = false;
  while (!got_accepted || !got_cancelled) {
    protocol::Message m;
    ASSERT_TRUE(protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) << fleet.Logs();
    msgpack::object_handle oh;
    ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
    if (m.command == protocol::kAccepted) {
      ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), accepted).ok());
      got_accepted = true;
    } else if (m.command == protocol::kCancelled) {
      ASSERT_TRUE(protocol::DecodeCancelled(oh.get(), cancelled).ok());
      got_cancelled = true;
    }
  }
}

// A job that ends in the turn it is accepted in (here a CANCEL read in the same turn as its
// SUBMIT: the broker is stopped while both reach its socket) is counted accepted, as the
// broker's STATS count it, and finished cancelled: every finished job was accepted first.
TEST(Metrics, AJobCancelledInItsAcceptanceTurnIsCountedAccepted) {
  const int broker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.broker_args = {"--metrics-port", std::to_string(broker_port)};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  zmq::context_t ctx(1);
  zmq::socket_t s = testutil::RawDealer(ctx, fleet.frontend(), 20000);
  ASSERT_EQ(testutil::RawExchange(s, {"FERRY1", "STATS", ""}), "STATS") << fleet.Logs();
  protocol::Accepted accepted;
  protocol::Cancelled cancelled;
  ASSERT_NO_FATAL_FAILURE(
      SubmitAndCancelInOneTurn(fleet, s, "cancelled-at-once", &accepted, &cancelled));
  EXPECT_EQ(accepted.ids, std::vector<std::string>{"cancelled-at-once"});
  Scraper broker{Url(broker_port, "/metrics")};
  ASSERT_TRUE(broker.WaitFor(names::kJobsFinished, {{"status", "cancelled"}}, 1)) << fleet.Logs();
  EXPECT_EQ(broker.Sum(names::kJobsAccepted, {{"model", "tiny"}}), 1);
  EXPECT_EQ(broker.Sum(names::kJobsDispatched), 0);  // cancelled before any dispatch
}

// The same while Redis is down: the job's `cancelled` result cannot be written, nor its journal
// record, so a broker that died then would leave neither for a job it had accepted. It is
// rejected `unavailable` instead (its result taken back, and not counted finished), and once
// Redis is back no result appears for it: the producer submits it again.
TEST(Metrics, AJobEndedInItsAcceptanceTurnWhileRedisIsDownIsRejected) {
  const int broker_port = testutil::FreePort();
  FleetOptions o;
  o.workers = 1;
  o.broker_args = {"--metrics-port", std::to_string(broker_port)};
  Fleet fleet(o);
  ASSERT_TRUE(fleet.WaitForWorkers(1)) << fleet.Logs();
  zmq::context_t ctx(1);
  zmq::socket_t s = testutil::RawDealer(ctx, fleet.frontend(), 20000);
  ASSERT_EQ(testutil::RawExchange(s, {"FERRY1", "STATS", ""}), "STATS") << fleet.Logs();
  const std::string id = "cancelled-while-redis-is-down";
  protocol::Accepted accepted;
  protocol::Cancelled cancelled;
  ASSERT_NO_FATAL_FAILURE(
      SubmitAndCancelInOneTurn(fleet, s, id, &accepted, &cancelled, [&] { fleet.redis().Stop(); }));
  // Cancelled while queued, its result not taken by Redis: reported `running` (protocol.md,
  // CANCEL). So both were read in one turn: else the CANCEL found nothing (`not_found`).
  ASSERT_EQ(cancelled.running, std::vector<std::string>{id})
      << cancelled.ids.size() << " cancelled, " << cancelled.not_found.size() << " not found\n"
      << fleet.Logs();
  EXPECT_TRUE(accepted.ids.empty()) << "accepted with neither journal record nor result";
  ASSERT_EQ(accepted.rejected.size(), 1u);
  EXPECT_EQ(accepted.rejected[0].id, id);
  EXPECT_EQ(accepted.rejected[0].code, codes::kUnavailable);

  fleet.redis().Restart();
  ClientOptions co;
  co.frontend = fleet.frontend();
  co.redis = fleet.redis().url();
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::Create(co, &c).ok());
  Result r;  // a job after it runs: the broker's writes of before have been tried by then
  ASSERT_TRUE(c->Run(TinyJob(3), 60000, &r).ok()) << fleet.Logs();
  Scraper broker{Url(broker_port, "/metrics")};
  ASSERT_TRUE(broker.Scrape());
  EXPECT_EQ(broker.Sum(names::kJobsAccepted, {{"model", "tiny"}}), 1);  // the Run's alone
  EXPECT_EQ(broker.Sum(names::kJobsRejected, {{"code", "unavailable"}}), 1);
  // Nor is it counted finished: its `cancelled` result was taken back before Redis had it.
  ASSERT_TRUE(broker.WaitFor(names::kJobsFinished, {{"status", "done"}}, 1)) << fleet.Logs();
  EXPECT_EQ(broker.Sum(names::kJobsFinished), 1) << "the Run's alone";
  auto redis = fleet.redis().Connect();
  ASSERT_TRUE(redis);
  protocol::RedisReply exists;
  ASSERT_TRUE(redis->Command({"EXISTS", protocol::Keys().Result(id)}, &exists).ok());
  EXPECT_EQ(exists.integer, 0) << "a result for a job the broker did not accept";
}

}  // namespace
}  // namespace ferry
