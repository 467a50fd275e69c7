// CurveZMQ on a real fleet (docs/security.md): redis-server, a ferry-broker with --curve-secret and
// allowlists, ferry-worker processes with their keys, the C++ SDK -- and attackers speaking the
// wire protocol by hand over raw DEALER sockets: a worker whose key is not listed, a producer whose
// key is not listed, a plaintext client, a client with the wrong server key, a listed worker that
// lies about the jobs it finished, a producer cancelling somebody else's job. Each must get nothing
// it is not owed while the fleet keeps serving the members it lists.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/text_format.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using testutil::Fleet;
using testutil::FleetOptions;
using testutil::TempDir;

// Keys for one fleet: DIR/secrets/NAME.key{,_secret} for every member, and the allow directories
// the broker reads (DIR/producers, DIR/workers, DIR/operators) holding the listed public keys.
class FleetKeys {
 public:
  FleetKeys() {
    for (const char* d : {"secrets", "producers", "workers", "operators"})
      fs::create_directories(dir_.path() + "/" + d);
    Make("broker");
  }
  // Makes NAME's key pair; `allow_dir` ("producers", "workers", "operators" or "") lists it.
  protocol::CurveKeyPair Make(const std::string& name, const std::string& allow_dir = "") {
    protocol::CurveKeyPair keys;
    EXPECT_TRUE(protocol::GenerateCurveKeyPair(&keys).ok());
    EXPECT_TRUE(protocol::WriteCertificates(dir_.path() + "/secrets", name, keys).ok());
    if (!allow_dir.empty()) Allow(name, allow_dir);
    return keys;
  }
  void Allow(const std::string& name, const std::string& allow_dir) {
    fs::copy_file(Public(name), dir_.path() + "/" + allow_dir + "/" + name + ".key",
                  fs::copy_options::overwrite_existing);
  }
  void Revoke(const std::string& name, const std::string& allow_dir) {
    fs::remove(dir_.path() + "/" + allow_dir + "/" + name + ".key");
  }
  std::string Public(const std::string& name) const {
    return dir_.path() + "/secrets/" + name + ".key";
  }
  std::string Secret(const std::string& name) const {
    return dir_.path() + "/secrets/" + name + ".key_secret";
  }
  std::vector<std::string> BrokerArgs() const {
    return {"--curve-secret",           Secret("broker"),          "--allow-producers",
            dir_.path() + "/producers", "--allow-workers",         dir_.path() + "/workers",
            "--allow-operators",        dir_.path() + "/operators"};
  }
  std::vector<std::string> WorkerArgs(const std::string& name) const {
    return {"--curve-server-public", Public("broker"), "--curve-secret", Secret(name)};
  }

 private:
  TempDir dir_;
};

// A raw DEALER that speaks CURVE with `keys` (plaintext when `keys` is null) to a server whose
// public key is `server_public`.
zmq::socket_t CurveDealer(zmq::context_t& ctx, const std::string& endpoint,
                          const protocol::CurveKeyPair* keys, const std::string& server_public) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndtimeo, 1000);  // a refused handshake leaves no pipe to send on
  if (keys) {
    s.set(zmq::sockopt::curve_serverkey, server_public);
    s.set(zmq::sockopt::curve_publickey, keys->public_key);
    s.set(zmq::sockopt::curve_secretkey, keys->secret_key);
  }
  s.connect(endpoint);
  return s;
}

// Sends one message; an attacker whose handshake was refused may have no pipe: that is fine.
void RawSend(zmq::socket_t& s, const std::string& command, const zmq::message_t& body) {
  if (!s.send(zmq::str_buffer("FERRY1"), zmq::send_flags::sndmore)) return;
  s.send(zmq::buffer(command), zmq::send_flags::sndmore);
  s.send(zmq::buffer(body.data(), body.size()), zmq::send_flags::none);
}

// The next message's command on `s` within `timeout_ms`, or "" when none came.
std::string RawRecv(zmq::socket_t& s, int timeout_ms, protocol::Message* out = nullptr) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return "";
  protocol::Message m;
  if (!protocol::RecvMessage(s, false, &m).ok()) return "";
  std::string command = m.command;
  if (out) *out = std::move(m);
  return command;
}

// A SUBMIT body of one `tiny` job `id` with an [8] float32 input.
zmq::message_t SubmitBody(const std::string& id, const std::string& model = "tiny",
                          int64_t timeout_ms = 0, int64_t result_ttl_s = 0) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  std::vector<float> x(8, 1.0f);
  Tensor t = Tensor::From(x, {8}, DType::kFloat32);
  protocol::PackSubmitJob(pk, id, model, {t}, 0, timeout_ms, result_ttl_s);
  return protocol::ToMessage(std::move(buf));
}

// The "code" of an ERROR body ("" when there is none).
std::string ErrorCode(const protocol::Message& m) {
  msgpack::object_handle oh;
  std::string code;
  if (protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok())
    (void)protocol::GetString(oh.get(), "code", &code);
  return code;
}

// Resident set size of a process, from /proc (0 when unreadable).
int64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// A READY that announces `models` with `capacity`.
zmq::message_t HelloBody(const std::string& name, const std::vector<std::string>& models,
                         int64_t capacity) {
  protocol::WorkerHello h;
  h.worker = name;
  h.device = "cpu";
  h.host = "attacker";
  h.pid = 4242;
  h.capacity = capacity;
  for (const auto& m : models) {
    protocol::ModelInfo info;
    info.name = m;
    info.max_batch = 16;
    h.models.push_back(info);
  }
  return protocol::EncodeHello(h);
}

// One counter of the broker's STATS reply ("accepted", "finished", ...), -1 when unreadable.
int64_t Counter(client::Client& c, const std::string& name) {
  std::string json;
  if (!c.Stats(&json).ok()) return -1;
  const std::string key = "\"" + name + "\":";
  size_t at = json.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(json.substr(at + key.size()));
}

int64_t PendingJobs(client::Client& c) { return Counter(c, "pending"); }

client::Job TinyJob(const std::string& id = "") {
  client::Job job;
  job.id = id;
  job.model = "tiny";
  job.inputs.push_back(Tensor::From(std::vector<float>(8, 2.0f), {8}, DType::kFloat32));
  return job;
}

// A CURVE fleet: one listed worker serving `tiny`, a listed producer (the SDK client) and a
// listed operator key.
class Curve : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_.Make("worker", "workers");
    keys_.Make("producer", "producers");
    keys_.Make("operator", "operators");
    keys_.Make("other", "producers");
    raw_worker_keys_[0] = keys_.Make("raw0", "workers");
    raw_worker_keys_[1] = keys_.Make("raw1", "workers");
    FleetOptions o;
    o.workers = 1;
    o.curve = false;  // the keys are this test's own
    o.broker_args = keys_.BrokerArgs();
    o.broker_args.push_back("--metrics-port");
    o.broker_args.push_back(std::to_string(metrics_port_));
    o.worker_args = keys_.WorkerArgs("worker");
    fleet_ = std::make_unique<Fleet>(o);
    client_ = MakeClient("producer");
    ASSERT_TRUE(client_);
    ASSERT_TRUE(
        testutil::WaitFor([&] { return Counter(*client_, "pending") == 0 && Workers() == 1; },
                          std::chrono::seconds(60)))
        << fleet_->Logs();
  }

  std::unique_ptr<client::Client> MakeClient(const std::string& name,
                                             const std::string& server_public = "") {
    client::ClientOptions o;
    o.frontend = fleet_->frontend();
    o.redis = fleet_->redis().url();
    o.request_timeout_ms = 2000;
    o.curve_server_public = server_public.empty() ? keys_.Public("broker") : server_public;
    o.curve_secret = keys_.Secret(name);
    std::unique_ptr<client::Client> c;
    Status s = client::Client::Create(o, &c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return c;
  }

  // Workers in STATS ("workers": [{"id": ...}, ...]): counts their "credit" fields.
  int Workers() {
    std::string json;
    if (!client_->Stats(&json).ok()) return -1;
    int n = 0;
    for (size_t at = json.find("\"credit\""); at != std::string::npos;
         at = json.find("\"credit\"", at + 1))
      ++n;
    return n;
  }

  void ExpectRuns(client::Client& c) {
    Result r;
    Status s = c.Run(TinyJob(), 30000, &r);
    ASSERT_TRUE(s.ok()) << s.ToString() << fleet_->Logs();
    EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
  }

  // A ferry-worker serving `tiny` with NAME's key.
  std::unique_ptr<testutil::Process> StartWorker(const std::string& name) {
    std::vector<std::string> argv = {testutil::WorkerBin(),
                                     "--broker",
                                     fleet_->backend(),
                                     "--redis",
                                     fleet_->redis().url(),
                                     "--threads",
                                     "1",
                                     "--model",
                                     "tiny=" + testutil::ModelPath("tiny")};
    for (const auto& a : keys_.WorkerArgs(name)) argv.push_back(a);
    return std::make_unique<testutil::Process>(argv, log_dir_.path() + "/" + name + ".log");
  }

  std::string BrokerPublicKey() {
    protocol::CurveKeyPair k;
    EXPECT_TRUE(protocol::ReadCertificate(keys_.Public("broker"), false, &k).ok());
    return k.public_key;
  }

  // A listed worker speaking by hand (raw0 or raw1) that announces `models` and `capacity`.
  zmq::socket_t RawWorker(int which, const std::vector<std::string>& models, int64_t capacity) {
    zmq::socket_t s =
        CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[which], BrokerPublicKey());
    RawSend(s, "READY", HelloBody("raw" + std::to_string(which) + ":1:cpu", models, capacity));
    return s;
  }

  // A raw DEALER for the listed producer "other".
  zmq::socket_t RawProducer() {
    protocol::CurveKeyPair other;
    EXPECT_TRUE(protocol::ReadCertificate(keys_.Secret("other"), true, &other).ok());
    zmq::socket_t s = CurveDealer(ctx_, fleet_->frontend(), &other, BrokerPublicKey());
    return s;
  }

  double Metric(const std::string& name) {
    std::string body;
    metrics::ParsedText parsed;
    if (!metrics::HttpGet("http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics", 2000,
                          &body)
             .ok() ||
        !metrics::ParseText(body, &parsed).ok())
      return -1;
    return metrics::SumSamples(parsed, name, {});
  }

  FleetKeys keys_;
  int metrics_port_ = testutil::FreePort();
  protocol::CurveKeyPair raw_worker_keys_[2];
  zmq::context_t ctx_{1};
  TempDir log_dir_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<client::Client> client_;
};

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
  keys_.Make("late");
  // Listed after start: refused until the broker re-reads its directories.
  keys_.Allow("late", "producers");
  fleet_->broker().Signal(SIGHUP);
  auto late = MakeClient("late");
  ASSERT_TRUE(late);
  ASSERT_TRUE(testutil::WaitFor(
      [&] {
        Result r;
        return late->Run(TinyJob(), 2000, &r).ok() && r.state == JobState::kDone;
      },
      std::chrono::seconds(20)))
      << fleet_->Logs();
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

TEST_F(Curve, AListedWorkerThatLiesAboutDoneFinishesNothing) {
  // raw0 serves `head` with room for one job and never answers: the first job runs on it, the
  // second waits in the queue. raw1 serves another model and holds nothing.
  zmq::socket_t holder = RawWorker(0, {"head"}, 1);
  zmq::socket_t liar = RawWorker(1, {"other"}, 4);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 3; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    client::Job job = TinyJob();
    job.model = "head";
    std::string id;
    Status st = client_->Submit(job, &id);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ids.push_back(id);
  }
  EXPECT_EQ(RawRecv(holder, 10000), "CHUNK");
  const int64_t finished = Counter(*client_, "finished");
  // raw1 claims both done (one running on raw0, one queued); raw0 claims the queued one.
  RawSend(liar, "DONE", protocol::EncodeDone(ids, 0));
  RawSend(holder, "DONE", protocol::EncodeDone({ids[1]}, 0));
  ExpectRuns(*client_);  // the broker reads the DONEs before it dispatches this job
  ASSERT_TRUE(
      testutil::WaitFor([&] { return PendingJobs(*client_) == 2; }, std::chrono::seconds(10)));
  EXPECT_EQ(Counter(*client_, "finished"), finished + 1);  // the `tiny` job just run
  for (const auto& id : ids) {
    Result r;
    ASSERT_TRUE(client_->Poll(id, &r).ok());
    EXPECT_EQ(r.state, JobState::kPending) << id;
  }
  EXPECT_NE(RawRecv(liar, 200), "CHUNK");
}

TEST_F(Curve, OnlyTheOwnerOrAnOperatorCancelsAJob) {
  // A job that waits in the queue: raw0 holds the first `head` job and never answers.
  zmq::socket_t holder = RawWorker(0, {"head"}, 1);
  ASSERT_TRUE(testutil::WaitFor([&] { return Workers() == 2; }, std::chrono::seconds(20)))
      << fleet_->Logs();
  client::Job job = TinyJob();
  job.model = "head";
  std::string running, queued;
  ASSERT_TRUE(client_->Submit(job, &running).ok());
  ASSERT_TRUE(client_->Submit(job, &queued).ok());
  auto other = MakeClient("other");
  ASSERT_TRUE(other);
  for (const std::string& id : {running, queued})
    EXPECT_EQ(other->Cancel(id).code(), std::string(codes::kNotFound)) << id;
  EXPECT_EQ(PendingJobs(*client_), 2);
  auto op = MakeClient("operator");
  ASSERT_TRUE(op);
  Status s = op->Cancel(queued);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Result r;
  ASSERT_TRUE(client_->Wait(queued, 10000, &r).ok());
  EXPECT_EQ(r.state, JobState::kCancelled);
  // The owner may cancel its running job (raw0 is asked to stop it).
  client::CancelReport report;
  ASSERT_TRUE(client_->CancelMany({running}, &report).ok());
  EXPECT_EQ(report.running, std::vector<std::string>{running});
}

// ---- Members that misbehave: a listed key, crafted messages. The fleet keeps serving. ----

TEST_F(Curve, AbsurdTtlIsRefusedAndAnEndlessTimeoutRuns) {
  zmq::socket_t s = RawProducer();
  // result_ttl_s 2^62: refused per job, by name, and no worker ever sees it.
  RawSend(s, "SUBMIT", SubmitBody("ttl-job", "tiny", 0, int64_t{1} << 62));
  protocol::Message m;
  ASSERT_EQ(RawRecv(s, 10000, &m), "ACCEPTED");
  msgpack::object_handle oh;
  ASSERT_TRUE(protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok());
  protocol::Accepted accepted;
  ASSERT_TRUE(protocol::DecodeAccepted(oh.get(), &accepted).ok());
  ASSERT_EQ(accepted.rejected.size(), 1u);
  EXPECT_EQ(accepted.rejected[0].id, "ttl-job");
  EXPECT_EQ(accepted.rejected[0].code, codes::kInvalidArgument);
  EXPECT_NE(accepted.rejected[0].message.find("--max-result-ttl-s"), std::string::npos);
  // timeout_ms INT64_MAX: no deadline (the arithmetic saturates), not "expired at once".
  RawSend(s, "SUBMIT", SubmitBody("endless-job", "tiny", std::numeric_limits<int64_t>::max()));
  ASSERT_EQ(RawRecv(s, 10000), "ACCEPTED");
  Result r;
  ASSERT_TRUE(client_->Wait("endless-job", 30000, &r).ok()) << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
  protocol::RedisReply ttl;
  ASSERT_TRUE(fleet_->redis().Connect()->Command({"TTL", "ferry:result:endless-job"}, &ttl).ok());
  EXPECT_GT(ttl.integer, 0);
  ExpectRuns(*client_);
}

TEST_F(Curve, ALyingReadyIsRefusedAndEvictsNobody) {
  std::string json;
  ASSERT_TRUE(client_->Stats(&json).ok());
  const size_t at = json.find("\"id\":\"");
  ASSERT_NE(at, std::string::npos) << json;
  const std::string live = json.substr(at + 6, json.find('"', at + 6) - at - 6);
  // raw0 takes the live worker's name; raw1 announces 3,005 models; raw1 again with control
  // characters in its name.
  zmq::socket_t thief = RawWorker(0, {"tiny"}, 4);
  std::vector<std::string> junk;
  for (int i = 0; i < 3005; ++i) junk.push_back("junk-" + std::to_string(i));
  zmq::socket_t flood =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[1], BrokerPublicKey());
  RawSend(flood, "READY", HelloBody("raw1:1:cpu", junk, 4));
  protocol::Message m;
  EXPECT_EQ(RawRecv(flood, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kInvalidArgument);
  RawSend(flood, "READY", HelloBody("raw1\x1b[2J\n:1:cpu", {"tiny"}, 4));
  EXPECT_EQ(RawRecv(flood, 10000, &m), "ERROR");
  zmq::socket_t name_thief =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[0], BrokerPublicKey());
  RawSend(name_thief, "READY", HelloBody(live, {"tiny"}, 4));
  EXPECT_EQ(RawRecv(name_thief, 10000, &m), "ERROR");
  // The live worker still serves; no junk model became known.
  for (int i = 0; i < 5; ++i) ExpectRuns(*client_);
  ASSERT_TRUE(client_->Stats(&json).ok());
  EXPECT_NE(json.find(live), std::string::npos);
  EXPECT_EQ(json.find("junk-"), std::string::npos);
  EXPECT_EQ(json.find("\x1b"), std::string::npos);
  EXPECT_GE(Metric(metrics::names::kMessagesRefused), 3);
}

TEST_F(Curve, AHugeSubmitOrCancelIsRefusedSmallAndCheaply) {
  zmq::socket_t s = RawProducer();
  const int64_t rss_before = RssBytes(fleet_->broker().pid());
  // 2^20 nils in "jobs" (1 MiB), four times: beyond the decoder's limits (malformed, before
  // anything is built from it). 20,000 nils: beyond the jobs a message may carry (too_large).
  auto nils = [](int n) {
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(n);
    for (int i = 0; i < n; ++i) pk.pack_nil();
    return protocol::ToMessage(std::move(buf));
  };
  for (int round = 0; round < 4; ++round) RawSend(s, "SUBMIT", nils(1 << 20));
  for (int round = 0; round < 4; ++round) {
    protocol::Message m;
    ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
    EXPECT_EQ(ErrorCode(m), codes::kMalformed);
    EXPECT_LT(m.body.size(), 1024u);
  }
  protocol::Message m;
  RawSend(s, "SUBMIT", nils(20000));
  ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kTooLarge);
  EXPECT_LT(m.body.size(), 1024u);
  // CANCEL of 20,000 ids: too_large too.
  RawSend(s, "CANCEL", protocol::EncodeIds(std::vector<std::string>(20000, "x")));
  ASSERT_EQ(RawRecv(s, 10000, &m), "ERROR");
  EXPECT_EQ(ErrorCode(m), codes::kTooLarge);
  ExpectRuns(*client_);
  EXPECT_EQ(Workers(), 1);
  EXPECT_LT(RssBytes(fleet_->broker().pid()) - rss_before, int64_t{64} << 20);
}

TEST_F(Curve, UnreadRepliesAreDroppedAndCountedNotHoarded) {
  zmq::socket_t s = RawProducer();
  s.set(zmq::sockopt::rcvhwm, 1);  // reads nothing: the replies pile up at the broker
  const int64_t rss_before = RssBytes(fleet_->broker().pid());
  for (int i = 0; i < 50000; ++i) RawSend(s, "STATS", protocol::EncodeEmpty(0));
  ASSERT_TRUE(testutil::WaitFor([&] { return Metric(metrics::names::kRepliesDropped) > 0; },
                                std::chrono::seconds(60)))
      << fleet_->Logs();
  ExpectRuns(*client_);
  EXPECT_EQ(Workers(), 1);
  EXPECT_LT(RssBytes(fleet_->broker().pid()) - rss_before, int64_t{200} << 20);
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
}  // namespace ferry
