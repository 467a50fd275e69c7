// `ferry status` and `ferry top`.
#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/runtime/redis_flags.h"
#include "fleet_view.h"
#include "ops_commands.h"

namespace ferry::cli {
namespace {

using runtime::FlagSet;
using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_top_stop = 0;
void OnTopSignal(int) { g_top_stop = 1; }

// Puts a tty stdin in non-canonical, no-echo mode (to read 'q' at once); restores on exit.
class RawTerminal {
 public:
  RawTerminal() {
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  bool active() const { return active_; }

 private:
  termios saved_{};
  bool active_ = false;
};

// Waits up to `ms`; returns true when the user asked to quit (q, Q, Ctrl-C, SIGTERM, stdin EOF
// on a tty).
bool WaitOrQuit(int ms, bool read_keys) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!g_top_stop) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) return false;
    pollfd p{STDIN_FILENO, POLLIN, 0};
    int r = poll(&p, read_keys ? 1 : 0, left);
    if (r > 0 && (p.revents & POLLIN)) {
      char c = 0;
      ssize_t n = read(STDIN_FILENO, &c, 1);
      if (n == 1 && (c == 'q' || c == 'Q' || c == 3)) return true;
    }
  }
  return true;
}

std::vector<Scrape> ScrapeAll(const std::vector<std::string>& urls, int timeout_ms) {
  std::vector<Scrape> out;
  for (const auto& url : urls) {
    Scrape s;
    s.url = url;
    std::string body;
    Status st = metrics::HttpGet(url, timeout_ms, &body);
    if (st.ok()) st = metrics::ParseText(body, &s.parsed);
    s.ok = st.ok();
    s.error = st.ToString();
    out.push_back(std::move(s));
  }
  return out;
}

Status Sample(client::Client* c, FleetStats* out) {
  std::string json;
  if (Status s = c->Stats(&json); !s.ok()) return s;
  return ParseFleetStats(json, out);
}

}  // namespace

void BrokerFlags::Register(FlagSet* f) {
  // Defaults from the environment (FERRY_FRONTEND, ...: ClientOptions::FromEnvironment); a flag
  // given on the command line wins. Only the producer-side commands register these: `ferry up`
  // has flags of its own and never takes a fleet's variables as its defaults.
  const client::ClientOptions env = client::ClientOptions::FromEnvironment();
  frontend = env.frontend;
  redis = env.redis;
  redis_prefix = env.redis_prefix;
  curve_server_public = env.curve_server_public;
  curve_secret = env.curve_secret;
  max_message_bytes = env.max_message_bytes;
  f->String("frontend", &frontend, "the broker's frontend endpoint ($FERRY_FRONTEND)");
  f->String("redis", &redis,
            "Redis holding the results, redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB] or "
            "unix:///PATH ($FERRY_REDIS)");
  runtime::AddRedisAccessFlags(f, &redis_files);
  f->String("redis-prefix", &redis_prefix, "prefix of Ferry's Redis keys ($FERRY_REDIS_PREFIX)");
  f->Int("request-timeout-ms", &request_timeout_ms, "how long to wait for the broker's answer");
  f->Int("max-message-bytes", &max_message_bytes,
         "the most a SUBMIT may carry (the broker's --max-message-bytes; a lower one the "
         "client learns from the broker): a bigger job is too_large before it is sent "
         "($FERRY_MAX_MESSAGE_BYTES)");
  f->String("curve-server-public", &curve_server_public,
            "CURVE: the broker's public certificate (its NAME.key; $FERRY_CURVE_SERVER_PUBLIC)");
  f->String("curve-secret", &curve_secret,
            "CURVE: this client's secret certificate (NAME.key_secret, listed by the broker; "
            "$FERRY_CURVE_SECRET)");
}

namespace {
// A Redis access file flag left empty takes $name -- where it applies to the final --redis URL,
// as ClientOptions::FromEnvironment and the Python client do: the TLS files to rediss://, the
// password file to a URL without a password.
std::string EnvFile(const std::string& flag_value, const char* name, bool applies) {
  if (!flag_value.empty() || !applies) return flag_value;
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

Status BrokerFlags::MakeClient(std::unique_ptr<client::Client>* out) const {
  if (request_timeout_ms <= 0 || request_timeout_ms > INT32_MAX)
    return Status::InvalidArgument("--request-timeout-ms must be 1.." + std::to_string(INT32_MAX));
  client::ClientOptions o;
  o.frontend = frontend;
  o.redis = redis;
  const bool tls = redis.rfind("rediss://", 0) == 0;
  const size_t scheme_end = redis.find("://"), at = redis.find('@');
  const bool has_password = scheme_end != std::string::npos && at != std::string::npos &&
                            redis.find(':', scheme_end + 3) < at;
  o.redis_password_file =
      EnvFile(redis_files.password_file, "FERRY_REDIS_PASSWORD_FILE", !has_password);
  o.redis_tls_ca = EnvFile(redis_files.tls_ca, "FERRY_REDIS_TLS_CA", tls);
  o.redis_tls_cert = EnvFile(redis_files.tls_cert, "FERRY_REDIS_TLS_CERT", tls);
  o.redis_tls_key = EnvFile(redis_files.tls_key, "FERRY_REDIS_TLS_KEY", tls);
  o.redis_prefix = redis_prefix;
  o.request_timeout_ms = static_cast<int>(request_timeout_ms);
  o.max_message_bytes = max_message_bytes;
  o.curve_server_public = curve_server_public;
  o.curve_secret = curve_secret;
  o.consume_results = consume_results;
  return client::Client::Create(o, out);
}

int FailWith(const Status& s) {
  std::fprintf(stderr, "ferry: %s\n", s.ToString().c_str());
  return ExitFor(s);
}

int RunStatus(std::vector<char*>& args) {
  BrokerFlags broker;
  FlagSet flags("ferry status",
                "Prints the broker's workers (device, models, credit, in-flight, last seen),\n"
                "queues (depth) and counters as tables. Works against a remote broker.");
  broker.Register(&flags);
  Status parsed = flags.Parse(static_cast<int>(args.size()), args.data());
  if (int rc = runtime::HandleFlagResult(flags, parsed); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "ferry status takes no arguments\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  std::unique_ptr<client::Client> c;
  if (Status s = broker.MakeClient(&c); !s.ok()) return FailWith(s);
  FleetStats stats;
  if (Status s = Sample(c.get(), &stats); !s.ok()) return FailWith(s);
  std::fputs(FormatStatus(stats, broker.frontend).c_str(), stdout);
  return kExitOk;
}

int RunTop(std::vector<char*>& args) {
  BrokerFlags broker;
  int64_t interval_ms = 1000, iterations = 0;
  std::vector<std::string> metrics_urls;
  FlagSet flags("ferry top",
                "Shows the fleet, refreshing every --interval-ms: throughput over the interval\n"
                "(from the broker's counters), workers, queues. With --metrics URLs (the broker's\n"
                "and workers' --metrics-port endpoints) also p50/p99 latency, busy %, batches/s\n"
                "and the oldest job's age. q or Ctrl-C quits. Without a terminal it prints one\n"
                "frame per interval (use --iterations to stop).");
  flags.Int("interval-ms", &interval_ms, "refresh interval");
  flags.Int("iterations", &iterations, "stop after this many frames (0 = until q/Ctrl-C)");
  flags.Repeated(
      "metrics", &metrics_urls,
      "a /metrics URL to scrape, e.g. http://host:9450/metrics (broker) or host:9460 (a worker)");
  broker.Register(&flags);
  Status parsed = flags.Parse(static_cast<int>(args.size()), args.data());
  if (int rc = runtime::HandleFlagResult(flags, parsed); rc >= 0) return rc;
  if (!flags.positional().empty() || interval_ms < 10 || interval_ms > 3600000 || iterations < 0) {
    std::fprintf(stderr, "ferry top takes no arguments; --interval-ms 10..3600000\n\n%s",
                 flags.Usage().c_str());
    return kExitUsage;
  }
  std::unique_ptr<client::Client> c;
  if (Status s = broker.MakeClient(&c); !s.ok()) return FailWith(s);

  const bool tty = isatty(STDOUT_FILENO);
  g_top_stop = 0;
  struct sigaction sa {};
  sa.sa_handler = OnTopSignal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  RawTerminal terminal;
  if (tty) std::fputs("\033[?1049h\033[?25l", stdout);  // alternate screen, hide cursor

  int scrape_timeout = static_cast<int>(std::min<int64_t>(interval_ms, 2000));
  FleetStats before;
  Status last = Sample(c.get(), &before);
  std::vector<Scrape> scrapes_before = ScrapeAll(metrics_urls, scrape_timeout);
  auto t_before = Clock::now();
  int64_t frames = 0, good_frames = 0;
  while (iterations == 0 || frames < iterations) {
    if (WaitOrQuit(static_cast<int>(interval_ms), terminal.active())) break;
    FleetStats after;
    Status s = Sample(c.get(), &after);
    std::vector<Scrape> scrapes_after = ScrapeAll(metrics_urls, scrape_timeout);
    auto t_after = Clock::now();
    double seconds = std::chrono::duration<double>(t_after - t_before).count();
    std::string frame;
    if (s.ok()) {
      // After a failed sample there is no baseline: show depths, rates from the next frame.
      IntervalMetrics m = ComputeIntervalMetrics(scrapes_before, scrapes_after, seconds);
      frame =
          FormatTop(last.ok() ? before : after, after, last.ok() ? seconds : 0, m, broker.frontend);
      ++good_frames;
    } else {
      frame = "ferry top  broker " + broker.frontend + ": " + s.ToString() + "\n";
    }
    if (tty)
      frame = "\033[H\033[2J" + frame + "\n(q to quit)";
    else if (frames > 0)
      frame = "\n" + frame;
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    ++frames;
    last = s;
    if (s.ok()) before = std::move(after);
    scrapes_before = std::move(scrapes_after);
    t_before = t_after;
  }
  if (tty) std::fputs("\033[?25h\033[?1049l", stdout);
  std::fflush(stdout);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (frames > 0 && good_frames == 0) return FailWith(last);
  return kExitOk;
}

}  // namespace ferry::cli
