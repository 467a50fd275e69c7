#include "fleet.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <zmq.hpp>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"

namespace ferry::testutil {

std::string BrokerBin() { return FERRY_BROKER_BIN; }
std::string WorkerBin() { return FERRY_WORKER_BIN; }
std::string CliBin() { return FERRY_CLI_BIN; }
std::string ModelsDir() { return FERRY_MODELS_DIR; }
std::string ModelPath(const std::string& name) { return ModelsDir() + "/" + name + ".pt"; }

bool FleetOptions::CurveFromEnvironment() {
  const char* v = std::getenv("FERRY_TEST_CURVE");
  return v != nullptr && std::string(v) == "1";
}

Fleet::Fleet(FleetOptions options)
    : options_(std::move(options)),
      redis_(std::make_unique<RedisServer>([&] {
        RedisServer::Options o;
        o.append_only = options_.redis_append_only;
        o.unix_socket = options_.redis_unix_socket;
        return o;
      }())),
      frontend_port_(FreePort()),
      backend_port_(FreePort()) {
  if (options_.curve) {
    for (const char* d : {"/keys", "/allow-producers", "/allow-workers"})
      std::filesystem::create_directories(dir_.path() + d);
    for (const char* name : {"broker", "worker", "producer"}) {
      protocol::CurveKeyPair k;
      Status s = protocol::GenerateCurveKeyPair(&k);
      if (s.ok()) s = protocol::WriteCertificates(dir_.path() + "/keys", name, k);
      if (!s.ok()) throw std::runtime_error("fleet keys: " + s.ToString());
    }
    std::filesystem::copy_file(dir_.path() + "/keys/worker.key",
                               dir_.path() + "/allow-workers/worker.key");
    std::filesystem::copy_file(dir_.path() + "/keys/producer.key",
                               dir_.path() + "/allow-producers/producer.key");
  }
  StartBroker();
  for (int i = 0; i < options_.workers; ++i) StartWorker(i);
}

Fleet::~Fleet() {
  for (auto& w : workers_) w.reset();
  broker_.reset();
}

void Fleet::StartBroker() {
  std::vector<std::string> argv = {BrokerBin(),
                                   "--frontend",
                                   "tcp://127.0.0.1:" + std::to_string(frontend_port_),
                                   "--backend",
                                   "tcp://127.0.0.1:" + std::to_string(backend_port_),
                                   "--redis",
                                   redis_url()};
  if (options_.curve) {
    for (const std::string& a :
         {std::string("--curve-secret"), dir_.path() + "/keys/broker.key_secret",
          std::string("--allow-producers"), dir_.path() + "/allow-producers",
          std::string("--allow-workers"), dir_.path() + "/allow-workers"})
      argv.push_back(a);
  }
  argv.insert(argv.end(), options_.broker_args.begin(), options_.broker_args.end());
  broker_ = std::make_unique<Process>(argv, dir_.path() + "/broker.log");
}

void Fleet::StartWorker(size_t i) {
  std::vector<std::string> argv = {WorkerBin(),
                                   "--broker",
                                   backend(),
                                   "--redis",
                                   redis_url(),
                                   "--max-batch",
                                   std::to_string(options_.max_batch),
                                   "--threads",
                                   "1"};
  for (const auto& m : options_.models) {
    argv.push_back("--model");
    argv.push_back(m + "=" + ModelPath(m));
  }
  if (options_.curve) {
    for (const std::string& a :
         {std::string("--curve-server-public"), dir_.path() + "/keys/broker.key",
          std::string("--curve-secret"), dir_.path() + "/keys/worker.key_secret"})
      argv.push_back(a);
  }
  argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  auto p = std::make_unique<Process>(argv, dir_.path() + "/worker" + std::to_string(i) + ".log");
  if (i < workers_.size())
    workers_[i] = std::move(p);
  else
    workers_.push_back(std::move(p));
}

bool Fleet::WaitForWorkers(size_t n, std::chrono::milliseconds timeout) {
  return WaitFor(
      [&] {
        return CountWorkers(frontend(), curve_server_public(), curve_secret()) ==
               static_cast<int>(n);
      },
      timeout);
}

std::string Fleet::curve_server_public() const {
  return options_.curve ? dir_.path() + "/keys/broker.key" : "";
}
std::string Fleet::curve_secret() const {
  return options_.curve ? dir_.path() + "/keys/producer.key_secret" : "";
}
std::string Fleet::CurveCliFlags() const {
  return options_.curve ? " --curve-server-public " + curve_server_public() + " --curve-secret " +
                              curve_secret() + " "
                        : "";
}

std::string Fleet::Logs() const {
  std::string out = "--- broker\n" + (broker_ ? broker_->Log() : "");
  for (size_t i = 0; i < workers_.size(); ++i)
    out += "--- worker " + std::to_string(i) + "\n" + (workers_[i] ? workers_[i]->Log() : "");
  return out;
}

int CountWorkers(const std::string& frontend, const std::string& curve_server_public,
                 const std::string& curve_secret) {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 500);
  s.set(zmq::sockopt::sndtimeo, 500);
  if (!protocol::ApplyCurveClient(s, curve_server_public, curve_secret).ok()) return -1;
  s.connect(frontend);
  if (!protocol::SendMessage(s, nullptr, protocol::kStats, protocol::EncodeEmpty()).ok()) return -1;
  protocol::Message m;
  if (!protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) return -1;
  if (m.command != protocol::kStats) return -1;
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok()) return -1;
  const msgpack::object* w = protocol::Find(oh.get(), "workers");
  return w && w->type == msgpack::type::ARRAY ? static_cast<int>(w->via.array.size) : -1;
}

}  // namespace ferry::testutil
