#include "process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "ferry/protocol/redis.h"

namespace ferry::testutil {

int64_t RssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int FileMode(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

bool NextPubSubMessage(protocol::RedisSubscriber* sub, std::string* payload) {
  payload->clear();
  bool got = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!got && std::chrono::steady_clock::now() < deadline) {
    pollfd p{sub->fd(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const Status s = sub->ReadAvailable([&](std::string_view m) {
      if (got) return;  // the first one only: callers publish one at a time
      payload->assign(m);
      got = true;
    });
    if (!s.ok()) return false;
  }
  return got;
}

namespace {

// Whether nothing holds `port` on 127.0.0.1 (a listening or connected socket, or one in
// TIME_WAIT: no SO_REUSEADDR here, so this is stricter than the servers' own bind).
bool CanBind(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Ports outside the kernel's ephemeral range (which connect() takes local ports from):
// [10000, low) when the range starts above 12000 (Linux's default: 32768), else above it.
std::pair<int, int> PortsOutsideTheEphemeralRange() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  if (!(file >> low >> high)) low = 32768, high = 60999;
  if (low > 12000) return {10000, low};
  if (high < 63000) return {high + 1, 65536};
  throw std::runtime_error("FreePort: the ephemeral range leaves too few ports outside it");
}

}  // namespace

int FreePort() {
  // Outside the ephemeral range: a port bind(0) hands out lies inside it, so an outgoing
  // connection of another test (a client to its Redis, say) could take it as its local port
  // before this test binds it, and a client that connects to it while nothing listens could
  // even connect to itself. Walking from a random start keeps the ports of one process
  // distinct; parallel test processes start at random places, so they rarely meet (about as
  // rarely as two bind(0)s), and each candidate is checked by binding.
  static std::mutex mu;
  static const std::pair<int, int> ports = PortsOutsideTheEphemeralRange();
  static const int first = ports.first;
  static const int span = ports.second - ports.first;
  static int next = static_cast<int>((std::random_device{}() ^ static_cast<unsigned>(getpid())) %
                                     static_cast<unsigned>(span));
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = first + next;
    next = (next + 1) % span;
    if (CanBind(port)) return port;
  }
  throw std::runtime_error("FreePort: no free port outside the ephemeral range");
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/ferry-test-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::Process(std::vector<std::string> argv, std::string log_path)
    : log_path_(std::move(log_path)) {
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    setpgid(0, 0);
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
}

Process::~Process() {
  if (Running()) {
    Signal(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

bool Process::Running() {
  if (exited_ || pid_ <= 0) return false;
  pid_t r = waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) exited_ = true;
  return !exited_;
}

void Process::Signal(int sig) {
  if (Running()) kill(pid_, sig);
}

int Process::Wait(std::chrono::milliseconds timeout) {
  if (!WaitFor([&] { return !Running(); }, timeout)) return -1;
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

std::string Process::Log() const { return ReadFile(log_path_); }

RedisServer::RedisServer(Options options)
    : options_(std::move(options)), port_(options_.port != 0 ? options_.port : FreePort()) {
  Start();
}

protocol::RedisEndpoint RedisServer::endpoint() const {
  protocol::RedisEndpoint ep;
  ep.port = port_;
  ep.user = options_.user;
  ep.password = options_.password.empty() ? options_.requirepass : options_.password;
  ep.tls = options_.tls;
  if (ep.tls) {
    ep.tls_ca = options_.tls_ca;
    ep.tls_cert = options_.client_cert;
    ep.tls_key = options_.client_key;
  }
  return ep;
}

std::unique_ptr<protocol::RedisClient> RedisServer::Connect() const {
  std::unique_ptr<protocol::RedisClient> c;
  if (!protocol::RedisClient::Connect(endpoint(), 2000, &c).ok()) return nullptr;
  return c;
}

void RedisServer::Start() {
  // FERRY_TEST_REDIS_SERVER: another server to test against (a Valkey build, say).
  const char* server = std::getenv("FERRY_TEST_REDIS_SERVER");
  std::vector<std::string> argv = {server != nullptr && *server ? server : "/usr/bin/redis-server",
                                   "--port",
                                   options_.tls ? "0" : std::to_string(port_),
                                   "--bind",
                                   "127.0.0.1",
                                   "--dir",
                                   dir_.path(),
                                   "--save",
                                   "",
                                   "--appendonly",
                                   options_.append_only ? "yes" : "no",
                                   "--appendfsync",
                                   "always"};
  if (!options_.requirepass.empty())
    argv.insert(argv.end(), {"--requirepass", options_.requirepass});
  if (!options_.acl_file.empty()) argv.insert(argv.end(), {"--aclfile", options_.acl_file});
  if (options_.unix_socket)
    argv.insert(argv.end(), {"--unixsocket", socket_path(), "--unixsocketperm", "700"});
  if (options_.tls)
    argv.insert(argv.end(),
                {"--tls-port", std::to_string(port_), "--tls-cert-file", options_.tls_cert,
                 "--tls-key-file", options_.tls_key, "--tls-ca-cert-file", options_.tls_ca,
                 "--tls-auth-clients", options_.tls_auth_clients ? "yes" : "no"});
  process_ = std::make_unique<Process>(argv, dir_.path() + "/redis.log");
  if (!WaitFor([&] { return Ping(); }, std::chrono::seconds(10)))
    throw std::runtime_error("redis-server did not start: " + process_->Log());
}

bool RedisServer::Ping() {
  std::unique_ptr<protocol::RedisClient> c;
  if (!protocol::RedisClient::Connect(endpoint(), 200, &c).ok()) return false;
  protocol::RedisReply r;
  return c->Command({"PING"}, &r).ok();
}

void RedisServer::Signal(int sig) { process_->Signal(sig); }

void RedisServer::Stop() {
  if (!process_) return;
  process_->Signal(SIGTERM);
  process_->Wait(std::chrono::seconds(10));
  process_.reset();
}

void RedisServer::Restart() {
  Stop();
  Start();
}

}  // namespace ferry::testutil
