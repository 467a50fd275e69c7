// CurveZMQ on a real fleet (docs/security.md), who gets in: redis-server, a ferry-broker with
// --curve-secret and allowlists, ferry-worker processes with their keys, the C++ SDK -- and
// attackers speaking the wire protocol by hand over raw DEALER sockets: a worker whose key is not
// listed, a producer whose key is not listed, a plaintext client, a client with the wrong server
// key. Each gets nothing while the fleet keeps serving the members it lists; keys added and
// revoked take effect at SIGHUP; and without CURVE the broker binds only loopback. What a listed
// member may not do: security_member_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/messages.h"
#include "fleet.h"
#include "process.h"
#include "security_fixture.h"

namespace ferry::security_test {
namespace {

TEST_F(Curve, ListedMembersRunJobs) {
  ExpectRuns(*client_);
  // The operator key may submit too (operators are admitted on the frontend).
  auto op = MakeClient("operator");
  ASSERT_TRUE(op);
  ExpectRuns(*op);
}

TEST_F(Curve, AnUnlistedWorkerGetsNoChunkAndIsNotAWorker) {
  zmq::context_t ctx(1);
  protocol::CurveKeyPair intruder = keys_.Make("intruder");  // not listed
  zmq::socket_t s = CurveDealer(ctx, fleet_->backend(), &intruder, BrokerPublicKey());
  RawSend(s, "READY", HelloBody("intruder:1:cpu", {"tiny"}, 1000));
  // Jobs for `tiny` while the intruder asks for them: every one runs on the listed worker.
  for (int i = 0; i < 20; ++i) ExpectRuns(*client_);
  EXPECT_EQ(RawRecv(s, 500), "") << "the intruder received a message";
  EXPECT_EQ(Workers(), 1);
  // Its DONE for a job it guessed changes nothing either.
  std::string id;
  ASSERT_TRUE(client_->Submit(TinyJob(), &id).ok());
  RawSend(s, "DONE", protocol::EncodeDone({id}, 0));
  Result r;
  ASSERT_TRUE(client_->Wait(id, 30000, &r).ok());
  EXPECT_EQ(r.state, JobState::kDone);
  EXPECT_EQ(r.worker.find("intruder"), std::string::npos);
}

TEST_F(Curve, AnUnlistedProducerGetsNoReplyAndNothingIsQueued) {
  zmq::context_t ctx(1);
  protocol::CurveKeyPair intruder = keys_.Make("stranger");
  zmq::socket_t s = CurveDealer(ctx, fleet_->frontend(), &intruder, BrokerPublicKey());
  const int64_t accepted = Counter(*client_, "accepted");
  RawSend(s, "SUBMIT", SubmitBody("stranger-job"));
  RawSend(s, "STATS", protocol::EncodeEmpty(0));
  EXPECT_EQ(RawRecv(s, 1000), "");
  EXPECT_EQ(Counter(*client_, "accepted"), accepted);
  EXPECT_EQ(PendingJobs(*client_), 0);
  Result r;
  ASSERT_TRUE(client_->Poll("stranger-job", &r).ok());
  EXPECT_EQ(r.state, JobState::kPending);
}

TEST_F(Curve, APlaintextClientGetsNothing) {
  zmq::context_t ctx(1);
  zmq::socket_t producer = CurveDealer(ctx, fleet_->frontend(), nullptr, "");
  zmq::socket_t worker = CurveDealer(ctx, fleet_->backend(), nullptr, "");
  RawSend(producer, "SUBMIT", SubmitBody("plain-job"));
  RawSend(worker, "READY", HelloBody("plain:1:cpu", {"tiny"}, 1000));
  ExpectRuns(*client_);
  EXPECT_EQ(RawRecv(producer, 500), "");
  EXPECT_EQ(RawRecv(worker, 100), "");
  EXPECT_EQ(Workers(), 1);
  Result r;
  ASSERT_TRUE(client_->Poll("plain-job", &r).ok());
  EXPECT_EQ(r.state, JobState::kPending);
}

TEST_F(Curve, AWrongServerKeyIsAClearUnavailableNamingCurve) {
  keys_.Make("impostor");  // its public key stands in for the broker's
  auto c = MakeClient("producer", keys_.Public("impostor"));
  ASSERT_TRUE(c);
  Result r;
  Status s = c->Run(TinyJob(), 3000, &r);
  EXPECT_EQ(s.code(), std::string(codes::kUnavailable)) << s.ToString();
  EXPECT_NE(s.message().find("CURVE"), std::string::npos) << s.ToString();
}

TEST_F(Curve, AnUnlistedProducerKeyIsAClearUnavailableNamingCurve) {
  keys_.Make("unlisted");
  auto c = MakeClient("unlisted");
  ASSERT_TRUE(c);
  std::string id;
  Status s = c->Submit(TinyJob(), &id);
  EXPECT_EQ(s.code(), std::string(codes::kUnavailable)) << s.ToString();
  EXPECT_NE(s.message().find("CURVE"), std::string::npos) << s.ToString();
}

TEST_F(Curve, SighupAddsAndRevokesKeysWithoutDroppingListedMembers) {
  // Listed after start: refused until the broker re-reads its directories.
  auto late = AdmitNewProducer("late");
  ASSERT_TRUE(late);
  // The worker stayed connected through the reload.
  ExpectRuns(*client_);
  EXPECT_EQ(Workers(), 1);

  // Revoked: the producer's next request gets nothing (its connection stays, its messages are
  // dropped), and the listed client keeps running jobs.
  keys_.Revoke("late", "producers");
  fleet_->broker().Signal(SIGHUP);
  ASSERT_TRUE(testutil::WaitFor(
      [&] {
        std::string id;
        return !late->Submit(TinyJob(), &id).ok();
      },
      std::chrono::seconds(20)));
  ExpectRuns(*client_);
}

// A revocation applies even while other key files are broken (half copied): those are named in
// the log and the rest of the directory applies. A broken file of a listed member (its key
// being rewritten) keeps that member's key. Before, one broken file kept the previous lists
// whole, the revoked key with them.
TEST_F(Curve, ARevocationAppliesWhileAnotherKeyFileIsBroken) {
  auto late = AdmitNewProducer("late");
  ASSERT_TRUE(late);
  keys_.Revoke("late", "producers");
  std::ofstream(keys_.AllowDir("producers") + "/half-copied.key") << "#   ZeroMQ Pub";
  std::ofstream(keys_.AllowDir("producers") + "/producer.key", std::ios::trunc) << "#   Zero";
  fleet_->broker().Signal(SIGHUP);
  ASSERT_TRUE(testutil::WaitFor(
      [&] {
        std::string id;
        return !late->Submit(TinyJob(), &id).ok();
      },
      std::chrono::seconds(20)))
      << "the revoked key still got in\n"
      << fleet_->Logs();
  ExpectRuns(*client_);  // "producer", its file being rewritten, keeps its key
  EXPECT_NE(fleet_->broker().Log().find("SIGHUP: a key file that does not read"), std::string::npos)
      << fleet_->broker().Log();
  EXPECT_NE(fleet_->broker().Log().find("half-copied.key"), std::string::npos);
  EXPECT_NE(fleet_->broker().Log().find("producer.key"), std::string::npos);
}

TEST_F(Curve, ARevokedWorkerIsDroppedAndItsJobsRunElsewhere) {
  keys_.Make("worker2", "workers");
  fleet_->broker().Signal(SIGHUP);
  std::unique_ptr<testutil::Process> worker2 = StartWorker("worker2");
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 2; }, std::chrono::seconds(60)))
      << fleet_->Logs() << worker2->Log();
  // The first worker's key leaves the list: the broker drops it at the reload, and every job
  // from then on runs on worker2.
  keys_.Revoke("worker", "workers");
  fleet_->broker().Signal(SIGHUP);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 1; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  const std::string worker2_pid = ":" + std::to_string(worker2->pid()) + ":";
  for (int i = 0; i < 10; ++i) {
    Result r;
    Status s = client_->Run(TinyJob(), 30000, &r);
    ASSERT_TRUE(s.ok()) << s.ToString() << fleet_->Logs();
    EXPECT_EQ(r.state, JobState::kDone);
    EXPECT_NE(r.worker.find(worker2_pid), std::string::npos) << r.worker;
  }
}

// A worker whose key the broker does not list says so in its log (from its socket's handshake
// events), instead of only that the broker is silent, and never joins.
TEST_F(Curve, AnUnlistedWorkerSaysInItsLogThatItsKeyWasRefused) {
  keys_.Make("stray");  // not listed
  std::unique_ptr<testutil::Process> stray =
      StartWorker("stray", {"--heartbeat-ms", "100", "--liveness", "3"});
  ASSERT_TRUE(testutil::WaitFor(
      [&] { return stray->Log().find("cannot join broker") != std::string::npos; },
      std::chrono::seconds(60)))
      << stray->Log();
  EXPECT_NE(stray->Log().find("refused this client's CURVE key"), std::string::npos)
      << stray->Log();
  EXPECT_EQ(Workers(), 1);
}

// A listed worker that takes the name of another key's worker gets ERROR for its READY: it says
// why in its log, once (not at each re-announce), and gets no work; the first keeps serving.
TEST_F(Curve, AWorkerWhoseReadyIsRefusedSaysWhyInItsLogOnce) {
  Result r;
  ASSERT_TRUE(client_->Run(TinyJob(), 30000, &r).ok());
  const std::string taken = r.worker;  // the fleet's worker's name
  keys_.Make("worker2", "workers");
  fleet_->broker().Signal(SIGHUP);
  std::unique_ptr<testutil::Process> second =
      StartWorker("worker2", {"--name", taken, "--heartbeat-ms", "100"});
  const std::string why = "the broker refused it: invalid_argument: worker name \"" + taken +
                          "\" is in use by a connection with another key";
  auto count = [&](const std::string& text) {
    const std::string log = second->Log();
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
    return n;
  };
  // Refused, then asked to re-announce at its heartbeats and refused again, three times over.
  ASSERT_TRUE(testutil::WaitFor([&] { return count("re-announce; sending READY") >= 3; },
                                std::chrono::seconds(60)))
      << second->Log();
  EXPECT_EQ(count(why), 1) << second->Log();
  EXPECT_EQ(Workers(), 1);
  ExpectRuns(*client_);
}

// Without CURVE, the broker binds only loopback: another address needs --curve-secret or, said
// out loud, --insecure.
TEST(CurveStartup, ANonLoopbackBindWithoutCurveIsRefused) {
  testutil::TempDir dir;
  const std::string frontend = "tcp://0.0.0.0:" + std::to_string(testutil::FreePort());
  const std::string backend = "tcp://127.0.0.1:" + std::to_string(testutil::FreePort());
  testutil::Process refused({testutil::BrokerBin(), "--frontend", frontend, "--backend", backend,
                             "--redis", "redis://127.0.0.1:1"},
                            dir.path() + "/refused.log");
  EXPECT_EQ(refused.Wait(), 2);
  EXPECT_NE(refused.Log().find("--insecure"), std::string::npos) << refused.Log();
  EXPECT_NE(refused.Log().find("0.0.0.0"), std::string::npos) << refused.Log();
}
}  // namespace
}  // namespace ferry::security_test
