#include "local_fleet.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "ferry/client.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/redis_endpoint.h"
#include "ferry/runtime/redis_flags.h"
#include "fleet_view.h"

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

}  // namespace

Status PrepareFleetKeys(const std::string& dir, size_t workers, FleetKeys* out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::InvalidArgument("cannot create the keys dir " + dir + ": " + ec.message());
  FleetKeys k;
  k.dir = fs::absolute(dir).string();
  if (chmod(k.dir.c_str(), 0700) != 0)
    return Status::InvalidArgument("cannot chmod 0700 " + k.dir + ": " + strerror(errno));
  // An existing pair is kept (checked); a missing one is made.
  auto pair = [&](const std::string& name) -> Status {
    const std::string secret = k.dir + "/" + name + ".key_secret";
    protocol::CurveKeyPair keys;
    if (fs::exists(secret, ec)) return protocol::ReadCertificate(secret, true, &keys);
    FERRY_RETURN_IF_ERROR(protocol::GenerateCurveKeyPair(&keys));
    return protocol::WriteCertificates(k.dir, name, keys);
  };
  auto allow = [&](const std::string& allow_dir, const std::string& name) -> Status {
    fs::create_directories(allow_dir, ec);
    if (!ec)
      fs::copy_file(k.dir + "/" + name + ".key", allow_dir + "/" + name + ".key",
                    fs::copy_options::overwrite_existing, ec);
    if (ec)
      return Status::InvalidArgument("cannot list " + name + " in " + allow_dir + ": " +
                                     ec.message());
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(pair("broker"));
  FERRY_RETURN_IF_ERROR(pair("producer"));
  k.broker_public = k.dir + "/broker.key";
  k.broker_secret = k.dir + "/broker.key_secret";
  k.producer_public = k.dir + "/producer.key";
  k.producer_secret = k.dir + "/producer.key_secret";
  k.allow_producers = k.dir + "/allow-producers";
  k.allow_workers = k.dir + "/allow-workers";
  FERRY_RETURN_IF_ERROR(allow(k.allow_producers, "producer"));
  for (size_t i = 0; i < workers; ++i) {
    const std::string name = "worker" + std::to_string(i);
    FERRY_RETURN_IF_ERROR(pair(name));
    FERRY_RETURN_IF_ERROR(allow(k.allow_workers, name));
    k.worker_secrets.push_back(k.dir + "/" + name + ".key_secret");
  }
  if (workers == 0) fs::create_directories(k.allow_workers, ec);
  *out = std::move(k);
  return Status::Ok();
}

bool PortFree(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host == "*" ? nullptr : host.c_str(), service.c_str(), &hints, &res) != 0)
    return true;  // the broker will say what is wrong with the address
  bool free = true;
  for (addrinfo* a = res; a && free; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) free = false;
    close(fd);
  }
  freeaddrinfo(res);
  return free;
}

bool ProcessListensOn(pid_t pid, int port) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;  // of its sockets
  if (DIR* d = opendir((proc + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      char target[64] = {};
      const ssize_t n = readlink((proc + "/fd/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (n > 9 && std::strncmp(target, "socket:[", 8) == 0)
        inodes.insert(std::string(target + 8, static_cast<size_t>(n) - 9));
    }
    closedir(d);
  }
  if (inodes.empty()) return false;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode))
        continue;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port && inodes.count(inode))
        return true;
    }
  }
  return false;
}

std::string TailLines(const std::string& path, int n, const std::string& indent) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return indent + "(no log: " + path + ")\n";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 16384);
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::istringstream lines_in(text);
  for (std::string line; std::getline(lines_in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // a partial first line
  if (lines.empty()) return indent + "(the log is empty)\n";
  std::string out;
  for (size_t i = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0; i < lines.size();
       ++i) {
    // Control characters (escape sequences) from a child's log never reach the terminal.
    std::string clean;
    for (char ch : lines[i])
      clean += (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') ? '?' : ch;
    out += indent + clean + "\n";
  }
  return out;
}

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
  const std::string host = options.bind_host == "0.0.0.0" ? "*" : options.bind_host;
  // Before anything starts: a port another broker (or an earlier `ferry up`) holds.
  for (const auto& [flag, port] :
       {std::pair<const char*, int>{"--frontend-port", f->frontend_port_},
        {"--backend-port", f->backend_port_}}) {
    if (!PortFree(host, port))
      return Status::Unavailable(std::string(flag) + " " + std::to_string(port) + ": " +
                                 options.bind_host + ":" + std::to_string(port) +
                                 " is in use (another broker, or an earlier ferry up?); stop it "
                                 "or give another port (0: a free one)");
  }
  if (!options.keys_dir.empty())
    FERRY_RETURN_IF_ERROR(PrepareFleetKeys(options.keys_dir, options.workers.size(), &f->keys_));

  FERRY_RETURN_IF_ERROR(f->SetUpRedisAccess());
  if (f->redis_url_.empty()) {
    int port = PickFreePort();
    std::vector<std::string> argv = {options.redis_server_bin,
                                     "--port",
                                     std::to_string(port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     options.log_dir,
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no"};
    // Our own children share Redis's host: they reach it over its Unix-domain socket, which
    // moves big values faster than loopback TCP (docs/performance.md, audio_unix). Producers
    // get the TCP URL, which works from anywhere on this host. A path the URL parser refuses
    // (too long for sun_path) keeps everyone on TCP.
    const std::string socket = std::filesystem::absolute(options.log_dir).string() + "/redis.sock";
    protocol::RedisEndpoint unix_endpoint;
    if (protocol::ParseRedisUrl("unix://" + socket, &unix_endpoint).ok()) {
      argv.insert(argv.end(), {"--unixsocket", socket, "--unixsocketperm", "700"});
      f->members_redis_url_ = "unix://" + socket;
    }
    FERRY_RETURN_IF_ERROR(f->Spawn("redis", argv, "", &f->redis_));
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!RedisAnswersPing(port)) {
      if (Reap(f->redis_.get()) || Clock::now() > deadline)
        return Status::Unavailable("redis-server did not start; see " + f->redis_->log);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    f->redis_url_ = "redis://127.0.0.1:" + std::to_string(port);
  }
  if (f->members_redis_url_.empty()) f->members_redis_url_ = f->redis_url_;

  std::vector<std::string> broker = {options.broker_bin,
                                     "--frontend",
                                     "tcp://" + host + ":" + std::to_string(f->frontend_port_),
                                     "--backend",
                                     "tcp://" + host + ":" + std::to_string(f->backend_port_),
                                     "--redis",
                                     f->members_redis_url_,
                                     "--redis-prefix",
                                     options.redis_prefix};
  const std::vector<std::string> redis_access = runtime::RedisAccessArgs(f->options_.redis_files);
  broker.insert(broker.end(), redis_access.begin(), redis_access.end());
  if (options.metrics_port_base > 0) {
    broker.push_back("--metrics-port");
    broker.push_back(std::to_string(options.metrics_port_base));
  }
  if (f->curve()) {
    const FleetKeys& k = f->keys_;
    broker.insert(broker.end(), {"--curve-secret", k.broker_secret, "--allow-producers",
                                 k.allow_producers, "--allow-workers", k.allow_workers});
  }
  broker.insert(broker.end(), options.broker_args.begin(), options.broker_args.end());
  FERRY_RETURN_IF_ERROR(f->Spawn("broker", broker, "", &f->broker_));

  for (size_t i = 0; i < options.workers.size(); ++i) {
    const WorkerSpec& spec = options.workers[i];
    std::vector<std::string> argv = {
        options.worker_bin,    "--broker",       f->backend(),        "--redis",
        f->members_redis_url_, "--redis-prefix", options.redis_prefix};
    argv.insert(argv.end(), redis_access.begin(), redis_access.end());
    for (const auto& m : options.models) {
      argv.push_back("--model");
      argv.push_back(m);
    }
    if (options.metrics_port_base > 0) {
      argv.push_back("--metrics-port");
      argv.push_back(std::to_string(options.metrics_port_base + 1 + static_cast<int>(i)));
    }
    if (f->curve())
      argv.insert(argv.end(), {"--curve-server-public", f->keys_.broker_public, "--curve-secret",
                               f->keys_.worker_secrets[i]});
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
  if (redis_)
    line(*redis_, members_redis_url_ == redis_url_
                      ? redis_url_
                      : redis_url_ + ", " + members_redis_url_ + " (broker, workers)");
  if (broker_) line(*broker_, frontend() + " (producers), " + backend() + " (workers)");
  for (size_t i = 0; i < workers_.size(); ++i) line(*workers_[i], options_.workers[i].label);
  return out;
}

bool LocalFleet::Reap(Child* c) {
  if (!c || c->exited) return true;
  if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->exited = true;
  return c->exited;
}

std::string LocalFleet::DescribeExit(const Child& c, const std::string& what) {
  return c.name + " " + ExitText(c.status) + what + "; the last lines of " + c.log + ":\n" +
         TailLines(c.log, 12, "    ");
}

Status LocalFleet::WaitReady(int timeout_ms, int request_timeout_ms,
                             const std::function<bool()>& stop) {
  client::ClientOptions o;
  o.frontend = frontend();
  o.redis = redis_url_;
  o.redis_password_file = options_.redis_files.password_file;
  o.redis_tls_ca = options_.redis_files.tls_ca;
  o.redis_tls_cert = options_.redis_files.tls_cert;
  o.redis_tls_key = options_.redis_files.tls_key;
  o.redis_prefix = options_.redis_prefix;
  o.request_timeout_ms = request_timeout_ms;
  if (curve()) {
    o.curve_server_public = keys_.broker_public;
    o.curve_secret = keys_.producer_secret;
  }
  std::unique_ptr<client::Client> c;
  FERRY_RETURN_IF_ERROR(client::Client::Create(o, &c));
  std::vector<Child*> children;
  if (redis_) children.push_back(redis_.get());
  children.push_back(broker_.get());
  for (auto& w : workers_) children.push_back(w.get());
  // Names to look for: every worker's, unless some --worker-arg renamed them; then a count.
  bool by_name = true;
  for (const auto& spec : options_.workers) by_name &= !spec.name.empty();
  for (const auto& a : options_.worker_args) by_name &= a != "--name" && a.rfind("--name=", 0) != 0;

  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  bool listening = false;
  std::string waiting_for = "the broker to listen on " + frontend() + " and " + backend();
  while (true) {
    // A child that exits now fails the start at once, with its last words.
    for (Child* ch : children)
      if (!ch->exited && Reap(ch))
        return Status::Unavailable(DescribeExit(*ch, " before the fleet was ready"));
    // Only once the broker we started holds both ports can STATS come from no other broker.
    if (!listening)
      listening = ProcessListensOn(broker_->pid, frontend_port_) &&
                  ProcessListensOn(broker_->pid, backend_port_);
    std::string json;
    FleetStats stats;
    if (listening && c->Stats(&json).ok() && ParseFleetStats(json, &stats).ok()) {
      std::set<std::string> registered;
      for (const auto& w : stats.workers) registered.insert(w.id);
      std::vector<size_t> missing;
      for (size_t i = 0; i < workers_.size(); ++i)
        if (by_name ? !registered.count(options_.workers[i].name) : registered.size() <= i)
          missing.push_back(i);
      if (missing.empty()) return Status::Ok();
      waiting_for.clear();
      for (size_t i : missing) {
        waiting_for += "\n  " + workers_[i]->name + " (" + options_.workers[i].label +
                       ") has not registered; the last lines of " + workers_[i]->log + ":\n" +
                       TailLines(workers_[i]->log, 5, "    ");
      }
    } else if (listening) {
      waiting_for = "an answer to STATS from the broker on " + frontend();
    }
    if (stop()) return Status(codes::kCancelled, "interrupted");
    if (Clock::now() >= deadline)
      return Status::Timeout("not ready within --ready-timeout-ms " + std::to_string(timeout_ms) +
                             ": waited for " + waiting_for);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status LocalFleet::Check(std::string* events) {
  for (auto& w : workers_) {
    if (!w->exited && Reap(w.get())) *events += DescribeExit(*w, "");
  }
  if (redis_ && !redis_->exited && Reap(redis_.get()))
    return Status::Unavailable(DescribeExit(*redis_, ""));
  if (broker_ && !broker_->exited && Reap(broker_.get()))
    return Status::Unavailable(DescribeExit(*broker_, ""));
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
