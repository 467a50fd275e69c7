#pragma once
// LocalFleet: the processes behind `ferry up` -- redis-server (unless an external Redis is given),
// ferry-broker and N ferry-workers, each a child process (fork/exec) in its own process group
// (so a terminal's Ctrl-C reaches only `ferry up`, which then stops them in order) with
// PR_SET_PDEATHSIG, so nothing outlives a killed `ferry up`. Logs go to LOG_DIR/<name>.log.
//
// Thread-safety: one thread owns a LocalFleet.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/redis_endpoint.h"
#include "ferry/status.h"

namespace ferry::cli {

struct WorkerSpec {
  std::string label;                 // "gpu 0", "cpu 1"
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
};

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
  // One line per process: name, pid, log file.
  std::string Describe() const;

  // Waits until the broker lists every worker; fails with timeout (saying how many came).
  Status WaitReady(int timeout_ms, int request_timeout_ms);
  // Reaps children that exited; reports each as a line in *events. Fails (unavailable) when the
  // broker or our redis-server is gone.
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

  LocalFleetOptions options_;
  std::string redis_url_;
  std::string written_password_file_;  // ours to remove
  int frontend_port_ = 0, backend_port_ = 0;
  std::unique_ptr<Child> redis_, broker_;
  std::vector<std::unique_ptr<Child>> workers_;
  bool drained_ = false;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int PickFreePort();

}  // namespace ferry::cli
