#pragma once
// Test helpers for real processes: free ports, temp dirs, child processes, a real redis-server.
// No mocks: integration tests start the same binaries users run.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ferry::protocol {
class RedisSubscriber;
}

namespace ferry::testutil {

// A TCP port on 127.0.0.1 that was free a moment ago, outside the kernel's ephemeral range (so
// no outgoing connection takes it meanwhile); distinct across one process's calls.
int FreePort();

// Polls `condition` every few ms until it holds or `timeout` passes. Returns the last result.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The next Pub/Sub message on `sub` (its payload), within 20 s; false when none came (or the
// connection failed).
bool NextPubSubMessage(protocol::RedisSubscriber* sub, std::string* payload);

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process (fork + exec) with stdout/stderr appended to `log_path`.
class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_path);
  ~Process();  // SIGKILLs the child if it still runs
  pid_t pid() const { return pid_; }
  bool Running();
  void Signal(int sig);
  // Waits for exit; returns the exit code, 128+signal, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  std::string Log() const;  // the log so far, for failure messages
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  bool exited_ = false;
  std::string log_path_;
};

// redis-server on a free port in its own temp dir; PING answers before the constructor returns.
class RedisServer {
 public:
  explicit RedisServer(bool append_only = false);
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  void Stop();     // SIGTERM and wait
  void Restart();  // on the same port and dir
  bool Ping();

 private:
  void Start();
  TempDir dir_;
  int port_;
  bool append_only_;
  std::unique_ptr<Process> process_;
};

}  // namespace ferry::testutil
