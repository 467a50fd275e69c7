#include "local_fleet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/client.h"
#include "ferry/runtime/redis_flags.h"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

bool RedisAnswersPing(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  bool ok = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
    char buf[16] = {};
    ok = recv(fd, buf, sizeof(buf) - 1, 0) > 0 && std::strncmp(buf, "+PONG", 5) == 0;
  }
  close(fd);
  return ok;
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

int CountWorkers(client::Client* c) {
  std::string json;
  if (!c->Stats(&json).ok()) return -1;
  int n = 0;
  for (size_t at = json.find("\"device\""); at != std::string::npos;
       at = json.find("\"device\"", at + 1))
    ++n;
  return n;
}

}  // namespace

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

Status LocalFleet::Spawn(const std::string& name, const std::vector<std::string>& argv,
                         const std::string& cuda_visible_devices, std::unique_ptr<Child>* out) {
  auto c = std::make_unique<Child>();
  c->name = name;
  c->log = options_.log_dir + "/" + name + ".log";
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Status::Internal("fork failed: " + std::string(strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);                        // Ctrl-C in the terminal reaches only `ferry up`
    prctl(PR_SET_PDEATHSIG, SIGTERM);     // and nothing outlives it
    if (getppid() != parent) _exit(126);  // it died before prctl
    int fd = open(c->log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (!cuda_visible_devices.empty())
      setenv("CUDA_VISIBLE_DEVICES", cuda_visible_devices.c_str(), 1);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "ferry up: cannot run %s: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  c->pid = pid;
  *out = std::move(c);
  return Status::Ok();
}

Status LocalFleet::Start(const LocalFleetOptions& options, std::unique_ptr<LocalFleet>* out) {
  std::unique_ptr<LocalFleet> f(new LocalFleet());
  f->options_ = options;
  f->frontend_port_ = options.frontend_port ? options.frontend_port : PickFreePort();
  f->backend_port_ = options.backend_port ? options.backend_port : PickFreePort();

  FERRY_RETURN_IF_ERROR(f->SetUpRedisAccess());
  if (f->redis_url_.empty()) {
    int port = PickFreePort();
    FERRY_RETURN_IF_ERROR(
        f->Spawn("redis",
                 {options.redis_server_bin, "--port", std::to_string(port), "--bind", "127.0.0.1",
                  "--dir", options.log_dir, "--save", "", "--appendonly", "no"},
                 "", &f->redis_));
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!RedisAnswersPing(port)) {
      if (Reap(f->redis_.get()) || Clock::now() > deadline)
        return Status::Unavailable("redis-server did not start; see " + f->redis_->log);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    f->redis_url_ = "redis://127.0.0.1:" + std::to_string(port);
  }

  std::string host = options.bind_host == "0.0.0.0" ? "*" : options.bind_host;
  std::vector<std::string> broker = {options.broker_bin,
                                     "--frontend",
                                     "tcp://" + host + ":" + std::to_string(f->frontend_port_),
                                     "--backend",
                                     "tcp://" + host + ":" + std::to_string(f->backend_port_),
                                     "--redis",
                                     f->redis_url_,
                                     "--redis-prefix",
                                     options.redis_prefix};
  const std::vector<std::string> redis_access = runtime::RedisAccessArgs(f->options_.redis_files);
  broker.insert(broker.end(), redis_access.begin(), redis_access.end());
  if (options.metrics_port_base > 0) {
    broker.push_back("--metrics-port");
    broker.push_back(std::to_string(options.metrics_port_base));
  }
  broker.insert(broker.end(), options.broker_args.begin(), options.broker_args.end());
  FERRY_RETURN_IF_ERROR(f->Spawn("broker", broker, "", &f->broker_));

  for (size_t i = 0; i < options.workers.size(); ++i) {
    const WorkerSpec& spec = options.workers[i];
    std::vector<std::string> argv = {options.worker_bin,  "--broker",    f->backend(),
                                     "--redis",           f->redis_url_, "--redis-prefix",
                                     options.redis_prefix};
    argv.insert(argv.end(), redis_access.begin(), redis_access.end());
    for (const auto& m : options.models) {
      argv.push_back("--model");
      argv.push_back(m);
    }
    if (options.metrics_port_base > 0) {
      argv.push_back("--metrics-port");
      argv.push_back(std::to_string(options.metrics_port_base + 1 + static_cast<int>(i)));
    }
    argv.insert(argv.end(), spec.args.begin(), spec.args.end());
    argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
    std::unique_ptr<Child> w;
    FERRY_RETURN_IF_ERROR(
        f->Spawn("worker" + std::to_string(i), argv, spec.cuda_visible_devices, &w));
    f->workers_.push_back(std::move(w));
  }
  *out = std::move(f);
  return Status::Ok();
}

Status LocalFleet::SetUpRedisAccess() {
  protocol::RedisAccessFiles& files = options_.redis_files;
  const bool any_file = !files.password_file.empty() || !files.tls_ca.empty() ||
                        !files.tls_cert.empty() || !files.tls_key.empty();
  if (options_.redis_url.empty()) {
    if (any_file)
      return Status::InvalidArgument(
          "--redis-password-file and --redis-tls-* are for an external Redis (--redis); the "
          "redis-server `ferry up` starts listens on 127.0.0.1 without them");
    return Status::Ok();
  }
  std::string password;
  redis_url_ = protocol::StripRedisPassword(options_.redis_url, &password);
  if (!password.empty()) {
    if (!files.password_file.empty())
      return Status::InvalidArgument(
          "the Redis password is given twice, in --redis and in --redis-password-file");
    const std::string path = options_.log_dir + "/redis.password";
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const bool written = fd >= 0 && write(fd, password.data(), password.size()) ==
                                        static_cast<ssize_t>(password.size());
    if (fd >= 0) close(fd);
    if (!written) return Status::Internal("cannot write " + path + ": " + strerror(errno));
    written_password_file_ = path;
    files.password_file = path;
  }
  protocol::RedisEndpoint endpoint;  // fail here, before any child starts
  return protocol::ResolveRedisEndpoint(redis_url_, files, &endpoint);
}

LocalFleet::~LocalFleet() {
  if (!drained_) Drain(10000);
  if (!written_password_file_.empty()) unlink(written_password_file_.c_str());
}

std::string LocalFleet::frontend() const {
  std::string host = options_.bind_host;
  if (host == "0.0.0.0" || host == "*") host = "127.0.0.1";
  return "tcp://" + host + ":" + std::to_string(frontend_port_);
}

std::string LocalFleet::backend() const {
  std::string host = options_.bind_host;
  if (host == "0.0.0.0" || host == "*") host = "127.0.0.1";
  return "tcp://" + host + ":" + std::to_string(backend_port_);
}

std::string LocalFleet::Describe() const {
  std::string out;
  auto line = [&](const Child& c, const std::string& what) {
    out += "  " + c.name + std::string(c.name.size() < 9 ? 9 - c.name.size() : 1, ' ') + "pid " +
           std::to_string(c.pid) + "  " + what + "  log " + c.log + "\n";
  };
  if (redis_) line(*redis_, redis_url_);
  if (broker_) line(*broker_, frontend() + " (producers), " + backend() + " (workers)");
  for (size_t i = 0; i < workers_.size(); ++i) line(*workers_[i], options_.workers[i].label);
  return out;
}

bool LocalFleet::Reap(Child* c) {
  if (!c || c->exited) return true;
  if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->exited = true;
  return c->exited;
}

Status LocalFleet::WaitReady(int timeout_ms, int request_timeout_ms) {
  client::ClientOptions o;
  o.frontend = frontend();
  o.redis = redis_url_;
  o.redis_password_file = options_.redis_files.password_file;
  o.redis_tls_ca = options_.redis_files.tls_ca;
  o.redis_tls_cert = options_.redis_files.tls_cert;
  o.redis_tls_key = options_.redis_files.tls_key;
  o.redis_prefix = options_.redis_prefix;
  o.request_timeout_ms = request_timeout_ms;
  std::unique_ptr<client::Client> c;
  FERRY_RETURN_IF_ERROR(client::Client::Create(o, &c));
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int want = static_cast<int>(workers_.size()), have = -1;
  while (Clock::now() < deadline) {
    std::string events;
    FERRY_RETURN_IF_ERROR(Check(&events));
    have = CountWorkers(c.get());
    if (have >= want) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Timeout(std::to_string(std::max(have, 0)) + " of " + std::to_string(want) +
                         " workers registered in time");
}

Status LocalFleet::Check(std::string* events) {
  for (auto& w : workers_) {
    if (!w->exited && Reap(w.get()))
      *events += w->name + " " + ExitText(w->status) + "; see " + w->log + "\n";
  }
  if (redis_ && !redis_->exited && Reap(redis_.get()))
    return Status::Unavailable("redis-server " + ExitText(redis_->status) + "; see " + redis_->log);
  if (broker_ && !broker_->exited && Reap(broker_.get()))
    return Status::Unavailable("ferry-broker " + ExitText(broker_->status) + "; see " +
                               broker_->log);
  return Status::Ok();
}

bool LocalFleet::StopAll(const std::vector<Child*>& children, int timeout_ms) {
  for (Child* c : children)
    if (!Reap(c)) kill(c->pid, SIGTERM);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool clean = true;
  for (Child* c : children) {
    while (!Reap(c) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!c->exited) {
      std::fprintf(stderr, "ferry up: %s did not stop in time; killing it\n", c->name.c_str());
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &c->status, 0);
      c->exited = true;
      clean = false;
    }
  }
  return clean;
}

bool LocalFleet::Drain(int timeout_ms) {
  drained_ = true;
  std::vector<Child*> workers;
  for (auto& w : workers_) workers.push_back(w.get());
  bool clean = StopAll(workers, timeout_ms);
  if (broker_) clean &= StopAll({broker_.get()}, timeout_ms);
  if (redis_) clean &= StopAll({redis_.get()}, timeout_ms);
  return clean;
}

}  // namespace ferry::cli
