// `ferry up`: the one-command local fleet.
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "ferry/protocol/curve.h"
#include "ferry/runtime/redis_flags.h"
#include "local_fleet.h"
#include "ops_commands.h"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;
using runtime::FlagSet;

volatile sig_atomic_t g_up_stop = 0;
void OnUpSignal(int) { g_up_stop = 1; }

bool IsExecutable(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// --bin-dir, else next to this `ferry` (install: bin/; build tree: ../broker, ../gpu-worker),
// else $PATH.
Status FindBinary(const std::string& name, const std::string& bin_dir, std::string* out) {
  std::vector<std::string> candidates;
  if (!bin_dir.empty()) {  // a directory of binaries, or a build tree
    for (const char* sub : {"", "/broker", "/gpu-worker"})
      candidates.push_back(bin_dir + sub + "/" + name);
  } else {
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec).parent_path();
    if (!ec) {
      candidates.push_back((self / name).string());
      candidates.push_back((self / ".." / "broker" / name).string());
      candidates.push_back((self / ".." / "gpu-worker" / name).string());
    }
    const char* path = getenv("PATH");
    std::string p = path ? path : "";
    for (size_t start = 0; start <= p.size();) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      if (end > start) candidates.push_back(p.substr(start, end - start) + "/" + name);
      start = end + 1;
    }
  }
  for (const auto& c : candidates) {
    if (IsExecutable(c)) {
      *out = fs::weakly_canonical(c).string();
      return Status::Ok();
    }
  }
  return Status::NotFound(name + " not found" +
                          (bin_dir.empty() ? " next to ferry or in $PATH" : " in " + bin_dir) +
                          "; give --bin-dir");
}

// GPU ids: --gpus, else $CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`. As CUDA reads the
// variable, set but empty means no GPU, and an entry that is negative ("-1", the usual way to
// hide every GPU) hides itself and every entry after it.
std::vector<std::string> VisibleGpus(const std::string& gpus_flag) {
  std::vector<std::string> out;
  auto split = [&](const std::string& s) {
    for (size_t start = 0; start < s.size();) {
      size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      std::string id = s.substr(start, end - start);
      id.erase(0, id.find_first_not_of(' '));
      id.erase(id.find_last_not_of(' ') + 1);
      if (!id.empty() && id[0] == '-') return;
      if (!id.empty()) out.push_back(id);
      start = end + 1;
    }
  };
  if (!gpus_flag.empty()) {
    if (gpus_flag != "none") split(gpus_flag);
    return out;
  }
  if (const char* env = getenv("CUDA_VISIBLE_DEVICES"); env != nullptr) {
    split(env);
    return out;
  }
  FILE* p = popen("nvidia-smi -L 2>/dev/null", "r");
  if (!p) return out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) {
    int index = -1;
    if (std::sscanf(buf, "GPU %d:", &index) == 1) out.push_back(std::to_string(index));
  }
  pclose(p);
  return out;
}

// A value for an env file that sh (`set -a; . FILE`), systemd's EnvironmentFile= and
// docker's --env-file read alike: as it is when plain, else in single quotes.
std::string EnvValue(const std::string& v) {
  bool plain = !v.empty();
  for (char c : v) plain &= std::isalnum(static_cast<unsigned char>(c)) || strchr("_./:@%+,=-", c);
  return plain ? v : "'" + v + "'";
}

// --model NAME=PATH: the file must be there before anything starts.
Status CheckModelFlag(const std::string& m) {
  const size_t eq = m.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == m.size())
    return Status::InvalidArgument("--model " + m + ": want NAME=PATH.pt");
  const std::string path = m.substr(eq + 1);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::InvalidArgument("--model " + m + ": no such file: " + path);
  if (!fs::is_regular_file(path, ec) || access(path.c_str(), R_OK) != 0)
    return Status::InvalidArgument("--model " + m + ": not a readable file: " + path);
  return Status::Ok();
}

std::string Hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// "ferry up: MESSAGE" on stderr, ending in exactly one newline.
void Say(const std::string& message) {
  std::string m = message;
  while (!m.empty() && m.back() == '\n') m.pop_back();
  std::fprintf(stderr, "ferry up: %s\n", m.c_str());
}

// The endpoints and what a producer or another worker passes to use them.
void PrintReady(const LocalFleet& fleet, const LocalFleetOptions& o) {
  // The URL without its password; the files (the password's too) as flags.
  std::string redis = fleet.redis_url();
  for (const auto& a : runtime::RedisAccessArgs(fleet.redis_files())) redis += " " + a;
  std::string producer_keys, worker_keys;
  if (fleet.curve()) {
    const FleetKeys& k = fleet.keys();
    producer_keys =
        " --curve-server-public " + k.broker_public + " --curve-secret " + k.producer_secret;
    worker_keys = " --curve-server-public " + k.broker_public +
                  " --curve-secret YOURS.key_secret (its .key in " + k.allow_workers +
                  ", then SIGHUP the broker)";
  }
  std::printf(
      "ferry up: ready\n"
      "  frontend  %s   (producers: ferry submit --frontend %s --redis %s%s ...)\n"
      "  backend   %s   (more workers: ferry-worker --broker %s --redis %s%s ...)\n"
      "  redis     %s%s\n",
      fleet.frontend().c_str(), fleet.frontend().c_str(), redis.c_str(), producer_keys.c_str(),
      fleet.backend().c_str(), fleet.backend().c_str(), redis.c_str(), worker_keys.c_str(),
      fleet.redis_url().c_str(), fleet.started_redis() ? " (started here)" : "");
  if (fleet.curve())
    std::printf(
        "  keys      %s (CURVE on: broker.key, producer.key_secret, allow-producers/, "
        "allow-workers/)\n",
        fleet.keys().dir.c_str());
  if (o.metrics_port_base > 0)
    std::printf("  metrics   http://127.0.0.1:%d/metrics (broker), ports %d.. (workers)\n",
                o.metrics_port_base, o.metrics_port_base + 1);
  std::printf("  logs      %s\nferry up: Ctrl-C to drain and stop\n", o.log_dir.c_str());
  std::fflush(stdout);
}

// The value an extra broker flag (--broker-arg) gives `name`, as "--name=V" or "--name" then
// "V"; the last one wins, as in the broker's own parsing. "" when none does.
std::string BrokerFlag(const std::vector<std::string>& args, const std::string& name) {
  std::string value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind(name + "=", 0) == 0)
      value = args[i].substr(name.size() + 1);
    else if (args[i] == name && i + 1 < args.size())
      value = args[++i];
  }
  return value;
}

// What a producer of this fleet needs, as FERRY_* variables named after the CLI's flags
// (--curve-secret -> FERRY_CURVE_SECRET): endpoints, and paths of files, never a secret itself.
Status WriteEnvFile(const std::string& path, const LocalFleet& fleet, const LocalFleetOptions& o) {
  std::ostringstream env;
  env << "FERRY_FRONTEND=" << EnvValue(fleet.frontend()) << "\n"
      << "FERRY_BACKEND=" << EnvValue(fleet.backend()) << "\n"
      << "FERRY_REDIS=" << EnvValue(fleet.redis_url()) << "\n"
      << "FERRY_REDIS_PREFIX=" << EnvValue(o.redis_prefix) << "\n"
      << "FERRY_LOG_DIR=" << EnvValue(o.log_dir) << "\n";
  // The URL above carries no password: the file does (--redis-password-file).
  const std::vector<std::string> access = runtime::RedisAccessArgs(fleet.redis_files());
  for (size_t i = 0; i + 1 < access.size(); i += 2) {
    std::string name = access[i].substr(2);  // --redis-tls-ca -> FERRY_REDIS_TLS_CA
    for (char& c : name) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    env << "FERRY_" << name << "=" << EnvValue(access[i + 1]) << "\n";
  }
  if (fleet.curve()) {
    env << "FERRY_CURVE_SERVER_PUBLIC=" << EnvValue(fleet.keys().broker_public) << "\n"
        << "FERRY_CURVE_SECRET=" << EnvValue(fleet.keys().producer_secret) << "\n";
  }
  if (o.metrics_port_base > 0)
    env << "FERRY_BROKER_METRICS=http://127.0.0.1:" << o.metrics_port_base << "/metrics\n";
  // A broker frame limit other than the default, as the SDKs' own ceiling
  // (ClientOptions::max_message_bytes): a lower one they would also learn from the broker
  // (LIMITS), a higher one they take only from here.
  if (const std::string limit = BrokerFlag(o.broker_args, "--max-message-bytes"); !limit.empty())
    env << "FERRY_MAX_MESSAGE_BYTES=" << EnvValue(limit) << "\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << env.str();
    if (!out.flush()) return Status::InvalidArgument("cannot write --env-file " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::InvalidArgument("cannot write --env-file " + path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

int RunUp(std::vector<char*>& args) {
  LocalFleetOptions o;
  std::string bin_dir, models_file, gpus, log_dir, env_file;
  int64_t cpu_workers = 0, frontend_port = 5555, backend_port = 5556, max_batch = 32;
  int64_t metrics_port_base = 0, ready_timeout_ms = 120000, drain_timeout_ms = 30000;
  bool curve = false;
  std::string keys_dir;
  FlagSet flags(
      "ferry up",
      "Starts a local fleet: redis-server (unless --redis), ferry-broker, and one ferry-worker\n"
      "per visible GPU (nvidia-smi -L / $CUDA_VISIBLE_DEVICES; each worker sees one GPU through\n"
      "CUDA_VISIBLE_DEVICES) or --cpu-workers N on the CPU. Prints the endpoints once every\n"
      "worker registered with the broker it started. Ctrl-C or SIGTERM drains: workers first\n"
      "(SIGTERM, wait), then the broker, then redis-server; exits 0. A child that exits before\n"
      "the fleet is ready (its last log lines are printed), a port in use or no readiness within\n"
      "--ready-timeout-ms: exit 1 (bad flags: 2). CURVE (keys made in --keys-dir) whenever\n"
      "--bind is not loopback, or with --curve. Binaries come from --bin-dir, next to ferry, or\n"
      "$PATH.");
  flags.Repeated("model", &o.models, "a model for every worker, NAME=PATH.pt");
  flags.String("models", &models_file,
               "a model repository file, passed to every worker as --models (docs/models.md)");
  flags.Int("cpu-workers", &cpu_workers, "run N CPU workers instead of one per GPU");
  flags.String("gpus", &gpus, "GPU ids to use, e.g. 0,2 (default: all visible; none = CPU)");
  flags.Int("max-batch", &max_batch, "--max-batch of every worker");
  flags.String("redis", &o.redis_url,
               "use this Redis (redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or unix:///PATH) "
               "instead of starting one; a password goes to the children in a file, never in "
               "argv");
  runtime::AddRedisAccessFlags(&flags, &o.redis_files);
  flags.String("redis-server", &o.redis_server_bin, "the redis-server binary to start");
  flags.String("redis-prefix", &o.redis_prefix, "prefix of Ferry's Redis keys");
  flags.String("bind", &o.bind_host,
               "address the broker binds (0.0.0.0 = all interfaces; not loopback: CURVE on)");
  flags.Bool("curve", &curve, "CURVE on both broker sockets even on loopback (keys in --keys-dir)");
  flags.String("keys-dir", &keys_dir,
               "where the CURVE keys are made (kept ones are reused) (default: LOG_DIR/keys)");
  flags.Int("frontend-port", &frontend_port, "the broker's producer port (0 = a free port)");
  flags.Int("backend-port", &backend_port, "the broker's worker port (0 = a free port)");
  flags.Int("metrics-port-base", &metrics_port_base,
            "> 0: broker --metrics-port BASE, worker i BASE+1+i (0 = no metrics flags)");
  flags.Repeated("broker-arg", &o.broker_args,
                 "an extra ferry-broker flag, e.g. "
                 "--broker-arg=--log-level=debug");
  flags.Repeated("worker-arg", &o.worker_args,
                 "an extra ferry-worker flag, e.g. "
                 "--worker-arg=--instances=2");
  flags.String("bin-dir", &bin_dir,
               "directory holding ferry-broker and ferry-worker (or a build "
               "tree: DIR/broker, DIR/gpu-worker)");
  flags.String("log-dir", &log_dir,
               "keep logs (and redis data) here (default: a temp dir, "
               "removed on exit)");
  flags.String("env-file", &env_file,
               "when ready, write what a producer needs here: FERRY_FRONTEND=, FERRY_REDIS=, "
               "FERRY_CURVE_SERVER_PUBLIC= (a path), ...; removed on exit");
  flags.Int("ready-timeout-ms", &ready_timeout_ms,
            "how long to wait for the workers to register (then exit 1)");
  flags.Int("drain-timeout-ms", &drain_timeout_ms, "per stage of the shutdown, then SIGKILL");
  Status parsed = flags.Parse(static_cast<int>(args.size()), args.data());
  if (int rc = runtime::HandleFlagResult(flags, parsed); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "ferry up takes no arguments\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  if (!models_file.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(models_file, ec)) {
      std::fprintf(stderr, "ferry up: no such --models file: %s\n", models_file.c_str());
      return kExitUsage;
    }
    o.worker_args.insert(o.worker_args.begin(), {"--models", fs::absolute(models_file).string()});
  }
  if (o.models.empty() && models_file.empty()) {
    std::fprintf(stderr, "ferry up needs --model NAME=PATH or --models FILE\n\n%s",
                 flags.Usage().c_str());
    return kExitUsage;
  }
  for (const auto& m : o.models) {
    if (Status s = CheckModelFlag(m); !s.ok()) {
      std::fprintf(stderr, "ferry up: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (frontend_port != 0 && frontend_port == backend_port) {
    std::fprintf(stderr, "ferry up: --frontend-port and --backend-port are both %lld\n",
                 static_cast<long long>(frontend_port));
    return kExitUsage;
  }
  if (ready_timeout_ms <= 0 || drain_timeout_ms <= 0 || ready_timeout_ms > INT32_MAX ||
      drain_timeout_ms > INT32_MAX) {
    std::fprintf(stderr, "ferry up: --ready-timeout-ms and --drain-timeout-ms must be 1..%d\n",
                 INT32_MAX);
    return kExitUsage;
  }
  if (cpu_workers < 0 || cpu_workers > 1024) {
    std::fprintf(stderr, "ferry up: --cpu-workers must be 0..1024\n");
    return kExitUsage;
  }
  for (const auto& [flag, port] :
       {std::pair<const char*, int64_t>{"--frontend-port", frontend_port},
        {"--backend-port", backend_port},
        {"--metrics-port-base", metrics_port_base}}) {
    if (port < 0 || port > 65535) {
      std::fprintf(stderr, "ferry up: %s must be 0..65535\n", flag);
      return kExitUsage;
    }
  }
  // Beyond loopback, anyone who reaches the ports would be a member: CURVE, always.
  const std::string bind_host = o.bind_host == "0.0.0.0" ? "*" : o.bind_host;
  curve = curve || !protocol::IsLoopbackEndpoint("tcp://" + bind_host + ":1");
  o.frontend_port = static_cast<int>(frontend_port);
  o.backend_port = static_cast<int>(backend_port);
  o.metrics_port_base = static_cast<int>(metrics_port_base);
  if (Status s = FindBinary("ferry-broker", bin_dir, &o.broker_bin); !s.ok()) return FailWith(s);
  if (Status s = FindBinary("ferry-worker", bin_dir, &o.worker_bin); !s.ok()) return FailWith(s);

  // Workers: one per GPU, or CPU workers sharing the cores.
  std::vector<std::string> gpu_ids =
      cpu_workers > 0 ? std::vector<std::string>{} : VisibleGpus(gpus);
  if (cpu_workers == 0 && gpu_ids.empty()) {
    std::printf("ferry up: no GPU visible; starting 1 CPU worker (--cpu-workers N for more)\n");
    cpu_workers = 1;
  }
  std::string host = Hostname();
  for (const auto& id : gpu_ids) {
    const std::string name = host + ":gpu" + id;
    o.workers.push_back(
        {"gpu " + id + " (cuda:0 with CUDA_VISIBLE_DEVICES=" + id + ")",
         name,
         {"--device", "cuda:0", "--name", name, "--max-batch", std::to_string(max_batch)},
         id});
  }
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (int64_t i = 0; i < cpu_workers; ++i) {
    int64_t threads = std::max<int64_t>(1, cores / cpu_workers);
    const std::string name = host + ":cpu" + std::to_string(i);
    o.workers.push_back({"cpu " + std::to_string(i),
                         name,
                         {"--device", "cpu", "--name", name, "--threads", std::to_string(threads),
                          "--max-batch", std::to_string(max_batch)},
                         ""});
  }
  // Worker i serves metrics on BASE+1+i: the last of them must be a port too.
  if (metrics_port_base > 0 && metrics_port_base + static_cast<int64_t>(o.workers.size()) > 65535) {
    std::fprintf(stderr, "ferry up: --metrics-port-base %lld leaves no port for worker %zu\n",
                 static_cast<long long>(metrics_port_base), o.workers.size() - 1);
    return kExitUsage;
  }

  bool temp_logs = log_dir.empty();
  if (temp_logs) {
    std::string tmpl = (fs::temp_directory_path() / "ferry-up-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return FailWith(Status::Internal("mkdtemp failed"));
    log_dir = tmpl;
  } else {
    std::error_code ec;
    fs::create_directories(log_dir, ec);
  }
  o.log_dir = fs::absolute(log_dir).string();
  if (curve) o.keys_dir = keys_dir.empty() ? o.log_dir + "/keys" : fs::absolute(keys_dir).string();

  // Signals before the children exist, so an early Ctrl-C still drains.
  g_up_stop = 0;
  struct sigaction sa {};
  sa.sa_handler = OnUpSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  int rc = kExitOk;
  bool wrote_env_file = false;
  {
    std::unique_ptr<LocalFleet> fleet;
    Status s = LocalFleet::Start(o, &fleet);
    if (!s.ok()) {
      Say(s.message());
      rc = s.code() == codes::kInvalidArgument ? kExitUsage : kExitFailed;
    } else {
      std::printf("ferry up: starting%s\n%s", fleet->curve() ? " (CURVE on)" : "",
                  fleet->Describe().c_str());
      std::fflush(stdout);
      // Waits for the workers; a child that exits first fails it at once; a signal drains.
      Status ready =
          fleet->WaitReady(static_cast<int>(ready_timeout_ms), 1000, [] { return g_up_stop != 0; });
      if (!ready.ok() && ready.code() != codes::kCancelled) {
        Say(ready.message());
        rc = kExitFailed;
      } else if (ready.ok()) {
        PrintReady(*fleet, o);
        if (!env_file.empty()) {
          if (Status w = WriteEnvFile(env_file, *fleet, o); !w.ok()) {
            Say(w.message());
            rc = kExitFailed;
          } else {
            wrote_env_file = true;
          }
        }
      }
      while (!g_up_stop && rc == kExitOk) {
        std::string events;
        Status alive = fleet->Check(&events);
        if (!events.empty()) Say(events);
        if (!alive.ok()) {
          Say(alive.message());
          rc = kExitFailed;
        } else
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::printf("ferry up: draining (workers, then the broker%s)\n",
                  fleet->started_redis() ? ", then redis" : "");
      std::fflush(stdout);
      bool clean = fleet->Drain(static_cast<int>(drain_timeout_ms));
      std::printf("ferry up: stopped%s\n", clean ? "" : " (some processes had to be killed)");
      if (!clean && rc == kExitOk) rc = kExitFailed;  // 0 says it drained cleanly
    }
  }
  std::error_code ec;
  if (temp_logs && (rc == kExitOk || fs::is_empty(log_dir, ec))) {
    fs::remove_all(log_dir, ec);
  } else if (temp_logs) {
    std::fprintf(stderr, "ferry up: logs kept in %s\n", log_dir.c_str());
  }
  // Only the file this run wrote: one that failed to start (a port in use) must not remove the
  // env file of the fleet already running there.
  if (wrote_env_file) fs::remove(env_file, ec);
  return rc;
}

}  // namespace ferry::cli
