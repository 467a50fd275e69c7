#pragma once
// Fleet: a real local Ferry deployment for integration tests -- redis-server, ferry-broker and
// N ferry-worker processes on free ports, torn down (SIGKILL if need be) on destruction.

#include <memory>
#include <string>
#include <vector>

#include "process.h"

namespace ferry::testutil {

// Paths of the binaries and the generated models (set by CMake as compile definitions).
std::string BrokerBin();
std::string WorkerBin();
std::string CliBin();
std::string ModelsDir();  // where ferry-make-models wrote tiny.pt, multi.pt, ...
std::string ModelPath(const std::string& name);  // ModelsDir() + "/" + name + ".pt"

struct FleetOptions {
  int workers = 2;
  std::vector<std::string> models = {"tiny"};  // names in ModelsDir(), served as NAME=PATH
  int max_batch = 16;
  std::vector<std::string> broker_args;
  std::vector<std::string> worker_args;
  bool redis_append_only = false;
  // The broker and the workers reach Redis over its Unix-domain socket (unix://).
  bool redis_unix_socket = false;
  // CurveZMQ on both broker sockets, with keys made for the fleet (a broker, a worker and a
  // producer key; the worker and producer listed). Defaults to $FERRY_TEST_CURVE=1, so that a
  // whole suite can run again with CURVE on (tests/integration/CMakeLists.txt does).
  bool curve = CurveFromEnvironment();
  static bool CurveFromEnvironment();
};

class Fleet {
 public:
  explicit Fleet(FleetOptions options = {});
  ~Fleet();

  std::string frontend() const { return "tcp://127.0.0.1:" + std::to_string(frontend_port_); }
  std::string backend() const { return "tcp://127.0.0.1:" + std::to_string(backend_port_); }
  RedisServer& redis() { return *redis_; }
  // The URL the broker and the workers reach Redis by (the socket's with redis_unix_socket).
  std::string redis_url() const {
    return options_.redis_unix_socket ? redis_->unix_url() : redis_->url();
  }
  Process& broker() { return *broker_; }
  Process& worker(size_t i) { return *workers_.at(i); }
  size_t worker_count() const { return workers_.size(); }

  void StartBroker();
  // Starts worker i (replacing a dead one at that index, or appending when i == count).
  void StartWorker(size_t i);
  // Waits until the broker's STATS lists `n` workers (true) or the timeout passes (false).
  bool WaitForWorkers(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // All logs, for failure messages.
  std::string Logs() const;
  // With options.curve: the files a producer names (ClientOptions::curve_server_public and
  // curve_secret, or the CLI's --curve-server-public/--curve-secret); "" without CURVE.
  std::string curve_server_public() const;
  std::string curve_secret() const;
  // The CLI flags for them (empty without CURVE), e.g. for `ferry cancel`.
  std::string CurveCliFlags() const;

 private:
  FleetOptions options_;
  TempDir dir_;
  std::unique_ptr<RedisServer> redis_;
  int frontend_port_;
  int backend_port_;
  std::unique_ptr<Process> broker_;
  std::vector<std::unique_ptr<Process>> workers_;
};

// Sends STATS over a fresh DEALER socket (with CURVE when the key files are given); returns the
// number of workers listed, -1 on error.
int CountWorkers(const std::string& frontend, const std::string& curve_server_public = "",
                 const std::string& curve_secret = "");

}  // namespace ferry::testutil
