#pragma once
// A real redis-server for the SDK's unit tests: a free port, a temp dir, fork/exec, PING before
// use, SIGTERM + waitpid + rm -rf at the end. (Integration tests use tests/testutil instead.)

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "process.h"

namespace ferry::client_test {

using testutil::FreePort;  // tests/testutil/process.h

class RedisProcess {
 public:
  // Starts redis-server; ok() says whether it answered PING within 10 s.
  RedisProcess() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ferry-sdk-redis-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return;
    dir_ = tmpl;
    port_ = FreePort();
    pid_ = fork();
    if (pid_ == 0) {
      std::string port = std::to_string(port_);
      std::string log = dir_ + "/redis.log";
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", dir_.c_str(), "--logfile", log.c_str(),
             static_cast<char*>(nullptr));
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Ping()) {
        ok_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~RedisProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  bool ok() const { return ok_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // A fresh connection for the test's own writes.
  std::unique_ptr<protocol::RedisClient> Connect() const {
    std::unique_ptr<protocol::RedisClient> c;
    protocol::RedisEndpoint ep;
    ep.port = port_;
    if (!protocol::RedisClient::Connect(ep, 2000, &c).ok()) return nullptr;
    return c;
  }

 private:
  bool Ping() const {
    auto c = Connect();
    protocol::RedisReply reply;
    return c && c->Command({"PING"}, &reply).ok() && reply.str == "PONG";
  }

  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
  bool ok_ = false;
};

}  // namespace ferry::client_test
