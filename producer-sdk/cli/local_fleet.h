#pragma once
// LocalFleet: the processes behind `ferry up` -- redis-server (unless an external Redis is given),
// ferry-broker and N ferry-workers, each a child process (fork/exec) in its own process group
// (so a terminal's Ctrl-C reaches only `ferry up`, which then stops them in order) with
// PR_SET_PDEATHSIG, so nothing outlives a killed `ferry up`. Logs go to LOG_DIR/<name>.log.
// With CURVE (keys_dir) the broker runs with --curve-secret and allow dirs made by
// PrepareFleetKeys, each worker with a key of its own, and the readiness checks with the
// producer's key.
//
// Thread-safety: one thread owns a LocalFleet.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"

namespace ferry::cli {

struct WorkerSpec {
  std::string label;                 // "gpu 0", "cpu 1"
  std::string name;                  // its --name (in args too); readiness looks for it
  std::vector<std::string> args;     // extra ferry-worker flags (--device, --name, ...)
  std::string cuda_visible_devices;  // set in its environment when non-empty
};

struct LocalFleetOptions {
  std::string broker_bin, worker_bin, redis_server_bin = "redis-server";
  std::string redis_url;  // empty: start redis-server on a free port in the log dir
  // An external Redis's password file and TLS files, passed on to the broker and the workers as
  // --redis-password-file/--redis-tls-*. A password inside redis_url goes to them through a
  // file too (LOG_DIR/redis.password, mode 0600, removed on exit), never on a command line.
  protocol::RedisAccessFiles redis_files;
  std::string bind_host = "127.0.0.1";
  int frontend_port = 5555;  // 0: a free port
  int backend_port = 5556;   // 0: a free port
  std::string redis_prefix = "ferry:";
  std::vector<std::string> models;  // NAME=PATH, each passed as --model to every worker
  std::vector<WorkerSpec> workers;
  std::vector<std::string> broker_args, worker_args;  // appended verbatim
  int metrics_port_base = 0;  // > 0: broker --metrics-port base, worker i base + 1 + i
  std::string log_dir;        // must exist
  // Non-empty: CURVE on both broker sockets, with the keys PrepareFleetKeys writes here.
  std::string keys_dir;
};

// The CURVE keys of a local fleet, all under one directory (mode 0700):
//   broker.key, broker.key_secret            the broker's pair
//   producer.key, producer.key_secret        for producers (and `ferry up`'s own checks)
//   workerN.key, workerN.key_secret          one pair per worker
//   allow-producers/producer.key             --allow-producers (public keys only)
//   allow-workers/workerN.key                --allow-workers (public keys only)
// Existing pairs are kept (a kept --keys-dir gives producers the same keys next time); the
// public keys are copied into the allow dirs each time. Secrets are 0600 (ferry keygen's files).
struct FleetKeys {
  std::string dir;
  std::string broker_public, broker_secret, producer_public, producer_secret;
  std::string allow_producers, allow_workers;
  std::vector<std::string> worker_secrets;  // one per worker
};
Status PrepareFleetKeys(const std::string& dir, size_t workers, FleetKeys* out);

class LocalFleet {
 public:
  // Starts redis (if needed), then the broker, then the workers; does not wait for the workers.
  static Status Start(const LocalFleetOptions& options, std::unique_ptr<LocalFleet>* out);
  ~LocalFleet();  // Drain(10 s) if still running

  std::string frontend() const;  // tcp://HOST:PORT for producers
  std::string backend() const;
  // The Redis URL without its password, and the files that complete it (the password's
  // included): what a producer of this fleet passes as --redis and --redis-*.
  const std::string& redis_url() const { return redis_url_; }
  const protocol::RedisAccessFiles& redis_files() const { return options_.redis_files; }
  bool started_redis() const { return redis_ != nullptr; }
  // With CURVE: the keys (curve() false: none).
  bool curve() const { return !options_.keys_dir.empty(); }
  const FleetKeys& keys() const { return keys_; }
  // One line per process: name, pid, log file.
  std::string Describe() const;

  // Waits until the fleet is ready: the broker we started listens on the frontend and backend
  // ports (so the answers come from it, not from another broker on the port) and lists every
  // worker we started. Fails at once (unavailable, with the child's last log lines) when any
  // child exits first; timeout (saying which workers are missing) after `timeout_ms`;
  // cancelled when `stop()` turns true.
  Status WaitReady(int timeout_ms, int request_timeout_ms, const std::function<bool()>& stop);
  // Reaps children that exited; reports each as a line in *events (with its last log lines).
  // Fails (unavailable) when the broker or our redis-server is gone.
  Status Check(std::string* events);
  // SIGTERM to the workers, wait (SIGKILL at the deadline), then the broker, then redis-server.
  // Returns true when everything exited on SIGTERM in time.
  bool Drain(int timeout_ms);

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    std::string log;
    bool exited = false;
    int status = 0;
  };
  LocalFleet() = default;
  Status Spawn(const std::string& name, const std::vector<std::string>& argv,
               const std::string& cuda_visible_devices, std::unique_ptr<Child>* out);
  static bool Reap(Child* c);  // true when it has exited
  static bool StopAll(const std::vector<Child*>& children, int timeout_ms);
  // redis_url_ and the access files from the options: a password in the URL moves to a file.
  Status SetUpRedisAccess();

  // "NAME exited with code N; the last lines of LOG:" and those lines, indented.
  static std::string DescribeExit(const Child& c, const std::string& what);

  LocalFleetOptions options_;
  FleetKeys keys_;
  std::string redis_url_;
  // What the broker and the workers we start are given: the socket of the redis-server we
  // started (unix://), else redis_url_.
  std::string members_redis_url_;
  std::string written_password_file_;  // ours to remove
  int frontend_port_ = 0, backend_port_ = 0;
  std::unique_ptr<Child> redis_, broker_;
  std::vector<std::unique_ptr<Child>> workers_;
  bool drained_ = false;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int PickFreePort();

// Whether `port` can be bound on `host` (an address, or "*" for all) right now, the way the
// broker binds it (SO_REUSEADDR). False when another process listens there.
bool PortFree(const std::string& host, int port);

// Whether process `pid` holds a listening TCP socket on `port` (Linux: /proc/PID/fd and
// /proc/PID/net/tcp{,6}).
bool ProcessListensOn(pid_t pid, int port);

// The last `n` lines of a file (for a child's log), each prefixed with `indent`.
std::string TailLines(const std::string& path, int n, const std::string& indent);

}  // namespace ferry::cli
