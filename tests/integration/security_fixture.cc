// The definitions of security_fixture.h.
#include "security_fixture.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/text_format.h"
#include "ferry/protocol/codec.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "fleet.h"
#include "process.h"

namespace ferry::security_test {

namespace fs = std::filesystem;

FleetKeys::FleetKeys() {
  for (const char* d : {"secrets", "producers", "workers", "operators"})
    fs::create_directories(dir_.path() + "/" + d);
  Make("broker");
}

protocol::CurveKeyPair FleetKeys::Make(const std::string& name, const std::string& allow_dir) {
  protocol::CurveKeyPair keys;
  EXPECT_TRUE(protocol::GenerateCurveKeyPair(&keys).ok());
  EXPECT_TRUE(protocol::WriteCertificates(dir_.path() + "/secrets", name, keys).ok());
  if (!allow_dir.empty()) Allow(name, allow_dir);
  return keys;
}

void FleetKeys::Allow(const std::string& name, const std::string& allow_dir) {
  fs::copy_file(Public(name), dir_.path() + "/" + allow_dir + "/" + name + ".key",
                fs::copy_options::overwrite_existing);
}

void FleetKeys::Revoke(const std::string& name, const std::string& allow_dir) {
  fs::remove(dir_.path() + "/" + allow_dir + "/" + name + ".key");
}

std::string FleetKeys::AllowDir(const std::string& allow_dir) const {
  return dir_.path() + "/" + allow_dir;
}

std::string FleetKeys::Public(const std::string& name) const {
  return dir_.path() + "/secrets/" + name + ".key";
}

std::string FleetKeys::Secret(const std::string& name) const {
  return dir_.path() + "/secrets/" + name + ".key_secret";
}

std::vector<std::string> FleetKeys::BrokerArgs() const {
  return {"--curve-secret",           Secret("broker"),          "--allow-producers",
          dir_.path() + "/producers", "--allow-workers",         dir_.path() + "/workers",
          "--allow-operators",        dir_.path() + "/operators"};
}

std::vector<std::string> FleetKeys::WorkerArgs(const std::string& name) const {
  return {"--curve-server-public", Public("broker"), "--curve-secret", Secret(name)};
}

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

void RawSend(zmq::socket_t& s, const std::string& command, const zmq::message_t& body) {
  if (!s.send(zmq::str_buffer("FERRY1"), zmq::send_flags::sndmore)) return;
  s.send(zmq::buffer(command), zmq::send_flags::sndmore);
  s.send(zmq::buffer(body.data(), body.size()), zmq::send_flags::none);
}

std::string RawRecv(zmq::socket_t& s, int timeout_ms, protocol::Message* out) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) <= 0) return "";
  protocol::Message m;
  if (!protocol::RecvMessage(s, false, &m).ok()) return "";
  std::string command = m.command;
  if (out) *out = std::move(m);
  return command;
}

std::string WorkerRecv(zmq::socket_t& s, int timeout_ms, protocol::Message* out) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string command;
  do {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    command = RawRecv(s, static_cast<int>(std::max<int64_t>(left, 0)), out);
  } while (command == protocol::kHeartbeat);
  return command;
}

zmq::message_t SubmitBody(const std::string& id, const std::string& model, int64_t timeout_ms,
                          int64_t result_ttl_s, const std::string& notify) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(notify.empty() ? 1 : 2);
  if (!notify.empty()) {
    protocol::PackString(pk, "notify");
    protocol::PackString(pk, notify);
  }
  protocol::PackString(pk, "jobs");
  pk.pack_array(1);
  std::vector<float> x(8, 1.0f);
  Tensor t = Tensor::From(x, {8}, DType::kFloat32);
  protocol::PackSubmitJob(pk, id, model, {t}, 0, timeout_ms, result_ttl_s);
  return protocol::ToMessage(std::move(buf));
}

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

int64_t Counter(client::Client& c, const std::string& name) {
  std::string json;
  if (!c.Stats(&json).ok()) return -1;
  const std::string key = "\"" + name + "\":";
  size_t at = json.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(json.substr(at + key.size()));
}

int64_t PendingJobs(client::Client& c) { return Counter(c, "pending"); }

client::Job TinyJob(const std::string& id) {
  client::Job job;
  job.id = id;
  job.model = "tiny";
  job.inputs.push_back(Tensor::From(std::vector<float>(8, 2.0f), {8}, DType::kFloat32));
  return job;
}

void Curve::SetUp() {
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
  ASSERT_TRUE(testutil::WaitFor([&] { return Counter(*client_, "pending") == 0 && Workers() == 1; },
                                std::chrono::seconds(60)))
      << fleet_->Logs();
}

std::unique_ptr<client::Client> Curve::MakeClient(const std::string& name,
                                                  const std::string& server_public) {
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

int Curve::Workers() {
  std::string json;
  if (!client_->Stats(&json).ok()) return -1;
  int n = 0;
  for (size_t at = json.find("\"credit\""); at != std::string::npos;
       at = json.find("\"credit\"", at + 1))
    ++n;
  return n;
}

void Curve::ExpectRuns(client::Client& c) {
  Result r;
  Status s = c.Run(TinyJob(), 30000, &r);
  ASSERT_TRUE(s.ok()) << s.ToString() << fleet_->Logs();
  EXPECT_EQ(r.state, JobState::kDone) << r.error.ToString();
}

std::unique_ptr<client::Client> Curve::AdmitNewProducer(const std::string& name) {
  keys_.Make(name, "producers");
  fleet_->broker().Signal(SIGHUP);
  auto c = MakeClient(name);
  if (!c) return nullptr;
  const bool runs = testutil::WaitFor(
      [&] {
        Result r;
        return c->Run(TinyJob(), 2000, &r).ok() && r.state == JobState::kDone;
      },
      std::chrono::seconds(20));
  EXPECT_TRUE(runs) << fleet_->Logs();
  return runs ? std::move(c) : nullptr;
}

std::unique_ptr<testutil::Process> Curve::StartWorker(const std::string& name,
                                                      const std::vector<std::string>& extra) {
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
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<testutil::Process>(argv, log_dir_.path() + "/" + name + ".log");
}

std::string Curve::BrokerPublicKey() {
  protocol::CurveKeyPair k;
  EXPECT_TRUE(protocol::ReadCertificate(keys_.Public("broker"), false, &k).ok());
  return k.public_key;
}

zmq::socket_t Curve::RawWorker(int which, const std::vector<std::string>& models,
                               int64_t capacity) {
  zmq::socket_t s =
      CurveDealer(ctx_, fleet_->backend(), &raw_worker_keys_[which], BrokerPublicKey());
  RawSend(s, "READY", HelloBody("raw" + std::to_string(which) + ":1:cpu", models, capacity));
  return s;
}

zmq::socket_t Curve::RawProducer() {
  protocol::CurveKeyPair other;
  EXPECT_TRUE(protocol::ReadCertificate(keys_.Secret("other"), true, &other).ok());
  zmq::socket_t s = CurveDealer(ctx_, fleet_->frontend(), &other, BrokerPublicKey());
  return s;
}

double Curve::Metric(const std::string& name, const std::map<std::string, std::string>& labels) {
  std::string body;
  metrics::ParsedText parsed;
  if (!metrics::HttpGet("http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics", 2000,
                        &body)
           .ok() ||
      !metrics::ParseText(body, &parsed).ok())
    return -1;
  return metrics::SumSamples(parsed, name, labels);
}

}  // namespace ferry::security_test
