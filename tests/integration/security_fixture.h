#pragma once
// What the CURVE tests share (security_access_test.cc, security_member_test.cc): the keys of one
// fleet and the broker's allow directories (FleetKeys); raw DEALER sockets that speak the wire
// protocol by hand, with CURVE or in plaintext, and the bodies they send; the broker's STATS
// counters; and the Curve fixture, a fleet whose broker lists its worker, producers and an
// operator. Defined in security_fixture.cc.

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"

namespace ferry::security_test {

using testutil::Fleet;
using testutil::FleetOptions;
using testutil::TempDir;

// Keys for one fleet: DIR/secrets/NAME.key{,_secret} for every member, and the allow directories
// the broker reads (DIR/producers, DIR/workers, DIR/operators) holding the listed public keys.
class FleetKeys {
 public:
  FleetKeys();
  // Makes NAME's key pair; `allow_dir` ("producers", "workers", "operators" or "") lists it.
  protocol::CurveKeyPair Make(const std::string& name, const std::string& allow_dir = "");
  void Allow(const std::string& name, const std::string& allow_dir);
  void Revoke(const std::string& name, const std::string& allow_dir);
  // The directory the broker reads `allow_dir`'s keys from.
  std::string AllowDir(const std::string& allow_dir) const;
  std::string Public(const std::string& name) const;
  std::string Secret(const std::string& name) const;
  std::vector<std::string> BrokerArgs() const;
  std::vector<std::string> WorkerArgs(const std::string& name) const;

 private:
  TempDir dir_;
};

// A raw DEALER that speaks CURVE with `keys` (plaintext when `keys` is null) to a server whose
// public key is `server_public`.
zmq::socket_t CurveDealer(zmq::context_t& ctx, const std::string& endpoint,
                          const protocol::CurveKeyPair* keys, const std::string& server_public);

// Sends one message; an attacker whose handshake was refused may have no pipe: that is fine.
void RawSend(zmq::socket_t& s, const std::string& command, const zmq::message_t& body);

// The next message's command on `s` within `timeout_ms`, or "" when none came.
std::string RawRecv(zmq::socket_t& s, int timeout_ms, protocol::Message* out = nullptr);

// RawRecv for a raw worker: HEARTBEATs are skipped (the broker sends one to every worker each
// --heartbeat-ms, in between whatever else it sends).
std::string WorkerRecv(zmq::socket_t& s, int timeout_ms, protocol::Message* out = nullptr);

// A SUBMIT body of one `tiny` job `id` with an [8] float32 input (and `notify`, when not "").
zmq::message_t SubmitBody(const std::string& id, const std::string& model = "tiny",
                          int64_t timeout_ms = 0, int64_t result_ttl_s = 0,
                          const std::string& notify = "");

// A READY that announces `models` with `capacity`.
zmq::message_t HelloBody(const std::string& name, const std::vector<std::string>& models,
                         int64_t capacity);

// One counter of the broker's STATS reply ("accepted", "finished", ...), -1 when unreadable.
int64_t Counter(client::Client& c, const std::string& name);

int64_t PendingJobs(client::Client& c);

client::Job TinyJob(const std::string& id = "");

// A CURVE fleet: one listed worker serving `tiny`, a listed producer (the SDK client) and a
// listed operator key.
class Curve : public ::testing::Test {
 protected:
  void SetUp() override;

  std::unique_ptr<client::Client> MakeClient(const std::string& name,
                                             const std::string& server_public = "");

  // Workers in STATS ("workers": [{"id": ...}, ...]): counts their "credit" fields.
  int Workers();

  void ExpectRuns(client::Client& c);

  // NAME's new key listed as a producer after start: SIGHUP, then a client under it once it
  // runs a job (refused until the broker has re-read its directories). Null on failure.
  std::unique_ptr<client::Client> AdmitNewProducer(const std::string& name);

  // A ferry-worker serving `tiny` with NAME's key, and `extra` flags.
  std::unique_ptr<testutil::Process> StartWorker(const std::string& name,
                                                 const std::vector<std::string>& extra = {});

  std::string BrokerPublicKey();

  // A listed worker speaking by hand (raw0 or raw1) that announces `models` and `capacity`.
  zmq::socket_t RawWorker(int which, const std::vector<std::string>& models, int64_t capacity);

  // A raw DEALER for the listed producer "other".
  zmq::socket_t RawProducer();

  // The sum of the broker's samples of `name` whose labels include `labels`; -1 when unreadable.
  double Metric(const std::string& name, const std::map<std::string, std::string>& labels = {});

  FleetKeys keys_;
  int metrics_port_ = testutil::FreePort();
  protocol::CurveKeyPair raw_worker_keys_[2];
  zmq::context_t ctx_{1};
  TempDir log_dir_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<client::Client> client_;
};

}  // namespace ferry::security_test
