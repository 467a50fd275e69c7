#pragma once
// Test helpers for real processes: free ports, temp dirs, child processes, a real redis-server.
// No mocks: integration tests start the same binaries users run.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"

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

// A process's resident memory (VmRSS in /proc/PID/status) in bytes; -1 when it cannot be read.
int64_t RssBytes(pid_t pid);

// A file's whole contents ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// A file's permission bits (st_mode & 07777); -1 when it is missing.
int FileMode(const std::string& path);

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

// redis-server on 127.0.0.1 in its own temp dir: the one launcher every test uses. PING answers
// before the constructor returns (it throws std::runtime_error, with the server's log, when
// redis-server does not come up within 10 s). The destructor stops it and removes the dir.
class RedisServer {
 public:
  struct Options {
    int port = 0;              // 0: a free port
    bool append_only = false;  // AOF with fsync always (for restart tests)
    std::string requirepass;   // the default user's password
    std::string acl_file;      // the users (--aclfile)
    // TLS only: `port` is the TLS port and there is no plain one. PEM files; with
    // tls_auth_clients a client needs a certificate that tls_ca signed.
    bool tls = false;
    std::string tls_cert, tls_key, tls_ca;
    bool tls_auth_clients = true;
    // Also listen on a Unix-domain socket, redis.sock in the server's dir (unix_url()).
    bool unix_socket = false;
    // Who this helper (Ping, Connect, endpoint()) is: an ACL user (empty: the default user) and
    // its password (empty: requirepass), and with TLS its client certificate and key.
    std::string user, password;
    std::string client_cert, client_key;
  };
  RedisServer() : RedisServer(Options{}) {}
  explicit RedisServer(Options options);
  int port() const { return port_; }
  // redis://127.0.0.1:PORT, or rediss://: no user or password.
  std::string url() const {
    return (options_.tls ? "rediss://127.0.0.1:" : "redis://127.0.0.1:") + std::to_string(port_);
  }
  // unix://PATH of the Unix-domain socket (Options::unix_socket), no user or password.
  std::string unix_url() const { return "unix://" + socket_path(); }
  std::string socket_path() const { return dir_.path() + "/redis.sock"; }
  // The helper's own endpoint: url() with its user, password and TLS files.
  protocol::RedisEndpoint endpoint() const;
  // A fresh connection for the test's own reads and writes; null when Redis does not answer.
  std::unique_ptr<protocol::RedisClient> Connect() const;
  void Stop();           // SIGTERM and wait
  void Restart();        // on the same port and dir
  void Signal(int sig);  // e.g. SIGSTOP and SIGCONT: a server that is slow, not gone
  bool Ping();

 private:
  void Start();
  TempDir dir_;
  Options options_;
  int port_;
  std::unique_ptr<Process> process_;
};

}  // namespace ferry::testutil
