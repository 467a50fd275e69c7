// ferry-floor: what this machine moves for big messages without any Ferry code -- the floor
// under Ferry's big-input scenarios (docs/performance.md, "Big inputs and outputs").
//
//   ferry-floor [--bytes 960000] [--messages 2000] [--redis redis://127.0.0.1:6379]
//               [--clients 1] [--json FILE] [--rate 0]
//
//   zmq two hops  producer PUSH -> relay (zmq_proxy PULL/PUSH) -> consumer PULL, three processes
//                 over TCP loopback: the shape of producer -> broker -> worker
//   zmq one hop   producer PUSH -> consumer PULL
//   redis SET     --clients connections each SET their share of the values (one at a time), over
//                 32 keys per connection: as short-lived inputs do, Redis reuses their memory
//   redis GET     the same connections GET them back
//
// Each line gives MB/s (10^6 bytes) and messages/s, measured where the bytes arrive (the consumer,
// or around the Redis commands). The Redis lines also give the server's CPU per value (from its
// INFO cpu, all its threads, user and system): what one SET and one GET of that size cost Redis
// itself, the floor under the CPU the durable claim check costs it per job. The zmq lines give
// each process's CPU per message too (producer, relay, consumer: user and system time, all their
// threads, the libzmq I/O threads included), the like of ferry-bench's CPU per job of the
// producer, the broker and the worker. The producer sends
// with zmq_send (one copy into the message, as any sender that keeps its own buffer does).
// High-water marks of 16 messages bound memory. Without --redis the Redis lines are skipped.
//
// --rate R paces the producer at R messages a second instead of as fast as it can: the CPU per
// message a bare relay pays at a given message rate, where each message may find it asleep
// (a wake-up of its thread and of its libzmq I/O thread), as a broker at a moderate load is.
// The floor under a broker's CPU per small message at that rate:
//   ferry-floor --bytes 300 --messages 3000 --rate 400
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/protocol/util.h"
#include "ferry/runtime/flags.h"
#include "ferry/runtime/malloc_policy.h"
#include "ferry/runtime/redis_flags.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void SetHwm(void* s) {
  int hwm = 16;
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
}

// Two distinct free TCP endpoints on 127.0.0.1: both ports bound (port 0) at once with plain
// sockets, read back and closed -- synchronously, unlike zmq_close.
// With `ipc`: two fresh Unix-domain socket paths under /tmp instead.
std::pair<std::string, std::string> FreeEndpoints(bool ipc) {
  if (ipc) {
    static int n = 0;
    const std::string base = "ipc:///tmp/ferry-floor-" + std::to_string(getpid()) + "-";
    n += 2;
    return {base + std::to_string(n - 1) + ".sock", base + std::to_string(n) + ".sock"};
  }
  int fds[2];
  std::string endpoints[2];
  for (int i = 0; i < 2; ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr), &len);
    endpoints[i] = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  close(fds[0]);
  close(fds[1]);
  return {endpoints[0], endpoints[1]};
}

// In a child process: the relay (binds both ends) until killed.
[[noreturn]] void Relay(const std::string& in, const std::string& out) {
  void* ctx = zmq_ctx_new();
  void* front = zmq_socket(ctx, ZMQ_PULL);
  void* back = zmq_socket(ctx, ZMQ_PUSH);
  SetHwm(front);
  SetHwm(back);
  if (zmq_bind(front, in.c_str()) != 0 || zmq_bind(back, out.c_str()) != 0) _exit(1);
  zmq_proxy(front, back, nullptr);
  _exit(0);
}

// In a child process: sends `messages` messages of `bytes` bytes (`rate` a second; 0: at once),
// then exits.
[[noreturn]] void Producer(const std::string& to, size_t bytes, int messages, double rate) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_PUSH);
  SetHwm(s);
  int linger = 30000;  // lets the last messages out, but never hangs on a consumer that left
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_connect(s, to.c_str()) != 0) _exit(1);
  std::vector<char> buf(bytes, 'x');
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < messages; ++i) {
    if (rate > 0)
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(i / rate)));
    if (zmq_send(s, buf.data(), buf.size(), 0) < 0) _exit(1);
  }
  zmq_close(s);
  zmq_ctx_term(ctx);
  _exit(0);
}

// Receives `messages` messages on `pull`; MB/s from the first to the last (the first message
// starts the clock, so the bytes after it count).
double Receive(void* pull, size_t bytes, int messages, int* got) {
  int timeout = 30000;
  zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  Clock::time_point first;
  size_t total = 0;
  *got = 0;
  for (int i = 0; i < messages; ++i) {
    if (zmq_msg_recv(&msg, pull, 0) < 0) break;
    if (i == 0) first = Clock::now();
    total += zmq_msg_size(&msg);
    ++*got;
  }
  const Clock::time_point last = Clock::now();
  zmq_msg_close(&msg);
  if (*got < 2) return 0;
  return static_cast<double>(total - bytes) / 1e6 / Seconds(first, last);
}

double CpuSeconds(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// CPU microseconds per message of each process of a zmq measurement (-1: not measured).
struct HopCpu {
  double producer_us = -1, relay_us = -1, consumer_us = -1;
};

// Producer (and relay) in child processes, the consumer here. Each process's CPU per message
// goes to *cpu: the children's from wait4, the consumer's (this process's) from getrusage.
double ZmqFloor(bool two_hops, bool ipc, size_t bytes, int messages, double rate, int* got,
                HopCpu* cpu) {
  rusage self0{}, self1{}, child{};
  getrusage(RUSAGE_SELF, &self0);
  void* ctx = zmq_ctx_new();
  const auto [consumer, spare] = FreeEndpoints(ipc);
  const std::string relay_in = two_hops ? spare : consumer;
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  SetHwm(pull);
  pid_t relay = -1;
  if (two_hops) {
    relay = fork();
    if (relay == 0) Relay(relay_in, consumer);  // binds both; this process connects
    zmq_connect(pull, consumer.c_str());
  } else {
    zmq_bind(pull, consumer.c_str());
  }
  const pid_t producer = fork();
  if (producer == 0) Producer(relay_in, bytes, messages, rate);
  const double mbps = Receive(pull, bytes, messages, got);
  zmq_close(pull);
  const double per_message = 1e6 / std::max(*got, 1);
  if (wait4(producer, nullptr, 0, &child) == producer)
    cpu->producer_us = CpuSeconds(child) * per_message;
  if (relay > 0) {
    kill(relay, SIGKILL);
    if (wait4(relay, nullptr, 0, &child) == relay) cpu->relay_us = CpuSeconds(child) * per_message;
  }
  zmq_ctx_term(ctx);
  getrusage(RUSAGE_SELF, &self1);
  cpu->consumer_us = (CpuSeconds(self1) - CpuSeconds(self0)) * per_message;
  if (ipc)
    for (const std::string& e : {consumer, spare}) unlink(e.substr(6).c_str());  // "ipc://"
  return mbps;
}

struct RedisRates {
  double set_mbps = 0, get_mbps = 0;
  double set_cpu_us = -1, get_cpu_us = -1;  // the server's CPU per value; -1: INFO cpu failed
  bool ok = false;
};

// The Redis server's CPU time so far, in seconds (INFO cpu: used_cpu_sys + used_cpu_user, every
// thread of the process), or -1.
double ServerCpuSeconds(redisContext* ctx) {
  auto* r = static_cast<redisReply*>(redisCommand(ctx, "INFO cpu"));
  double total = -1;
  if (r != nullptr && r->type == REDIS_REPLY_STRING) {
    const std::string info(r->str, r->len);
    double sum = 0;
    int found = 0;
    for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
      const size_t at = info.find(std::string("\n") + field);
      if (at == std::string::npos) continue;
      sum += std::strtod(info.c_str() + at + 1 + std::strlen(field), nullptr);
      ++found;
    }
    if (found == 2) total = sum;
  }
  if (r != nullptr) freeReplyObject(r);
  return total;
}

RedisRates RedisFloor(const ferry::protocol::RedisEndpoint& ep, size_t bytes, int messages,
                      int clients) {
  RedisRates out;
  std::vector<redisContext*> conns;
  for (int c = 0; c < clients; ++c) {
    redisContext* ctx = ep.unix_path.empty() ? redisConnect(ep.host.c_str(), ep.port)
                                             : redisConnectUnix(ep.unix_path.c_str());
    if (ctx == nullptr || ctx->err) {
      std::fprintf(stderr, "ferry-floor: cannot connect to redis %s\n", ep.Address().c_str());
      return out;
    }
    conns.push_back(ctx);
    // As Ferry's clients do at every connection: AUTH (an ACL user, or the default user), SELECT.
    std::vector<std::vector<std::string>> hello;
    if (!ep.password.empty())
      hello.push_back(ep.user.empty() ? std::vector<std::string>{"AUTH", ep.password}
                                      : std::vector<std::string>{"AUTH", ep.user, ep.password});
    if (ep.db != 0) hello.push_back({"SELECT", std::to_string(ep.db)});
    for (const auto& command : hello) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& a : command) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      auto* r = static_cast<redisReply*>(
          redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
      const bool refused = r == nullptr || r->type == REDIS_REPLY_ERROR;
      if (refused) {
        const std::string what = command[0] == "AUTH" ? "the credentials of user " + ep.UserName()
                                                      : "SELECT " + command[1];
        const std::string why = r ? std::string(r->str, r->len) : std::string(ctx->errstr);
        std::fprintf(stderr, "ferry-floor: redis %s refused %s: %s\n", ep.Address().c_str(),
                     what.c_str(), why.c_str());
      }
      if (r) freeReplyObject(r);
      if (refused) {
        for (auto* c : conns) redisFree(c);
        return out;
      }
    }
  }
  const std::string value(bytes, 'x');
  auto run = [&](bool set) {
    std::vector<std::thread> threads;
    const Clock::time_point start = Clock::now();
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        for (int i = c; i < messages; i += clients) {
          const std::string key = "ferry-floor:" + std::to_string(c) + ":" + std::to_string(i % 32);
          redisReply* r =
              set ? static_cast<redisReply*>(redisCommand(conns[c], "SET %b %b", key.data(),
                                                          key.size(), value.data(), value.size()))
                  : static_cast<redisReply*>(
                        redisCommand(conns[c], "GET %b", key.data(), key.size()));
          if (r != nullptr) freeReplyObject(r);
        }
      });
    }
    for (auto& t : threads) t.join();
    return static_cast<double>(bytes) * messages / 1e6 / Seconds(start, Clock::now());
  };
  // CPU per value, when the server says it (to the microsecond): before and after each run.
  auto cpu_us = [&](double before, double after) {
    return before < 0 || after < 0 ? -1.0 : (after - before) * 1e6 / messages;
  };
  const double cpu0 = ServerCpuSeconds(conns[0]);
  out.set_mbps = run(true);
  const double cpu1 = ServerCpuSeconds(conns[0]);
  out.get_mbps = run(false);
  const double cpu2 = ServerCpuSeconds(conns[0]);
  out.set_cpu_us = cpu_us(cpu0, cpu1);
  out.get_cpu_us = cpu_us(cpu1, cpu2);
  for (int c = 0; c < clients; ++c) {
    for (int i = 0; i < 32; ++i) {
      const std::string key = "ferry-floor:" + std::to_string(c) + ":" + std::to_string(i);
      freeReplyObject(redisCommand(conns[0], "DEL %b", key.data(), key.size()));
    }
  }
  for (auto* c : conns) redisFree(c);
  out.ok = true;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = 960000, messages = 2000, clients = 1, rate = 0;
  std::string redis, json, transport = "tcp";
  ferry::runtime::FlagSet flags(
      "ferry-floor", "Bare libzmq and Redis throughput for big messages (no Ferry code).");
  flags.Int("bytes", &bytes, "message / value size in bytes");
  flags.Int("messages", &messages, "messages (and Redis values) per measurement");
  flags.String("redis", &redis,
               "redis://[USER[:PASSWORD]@]HOST:PORT[/DB] or unix:///PATH to measure SET and GET "
               "against (off: empty; bare hiredis 0.14 has no TLS, so no rediss://)");
  ferry::protocol::RedisAccessFiles redis_files;
  ferry::runtime::AddRedisAccessFlags(&flags, &redis_files);
  flags.Int("clients", &clients, "Redis connections (threads) for SET and GET");
  flags.String("json", &json, "also write the figures to this JSON file");
  flags.Int("rate", &rate,
            "messages a second the zmq producer sends (0: as fast as it can): the CPU per "
            "message at a moderate rate, each message a wake-up");
  flags.String("transport", &transport,
               "tcp (127.0.0.1) or ipc (Unix-domain sockets under /tmp) for the zmq hops");
  if (int rc = ferry::runtime::HandleFlagResult(flags, flags.Parse(argc, argv)); rc >= 0) return rc;
  if (bytes <= 0 || messages < 2 || clients < 1 || rate < 0 ||
      (transport != "tcp" && transport != "ipc")) {
    std::fprintf(stderr,
                 "ferry-floor: --bytes > 0, --messages >= 2, --clients >= 1, --rate >= 0, "
                 "--transport tcp|ipc\n");
    return 2;
  }
  const bool ipc = transport == "ipc";
  // As Ferry's servers do (runtime/malloc_policy.h): big buffers are not page-faulted in afresh.
  std::string malloc_what;
  ferry::runtime::KeepFreedMemory(&malloc_what);
  int got = 0;
  HopCpu two_cpu, one_cpu;
  const double r_msgs = static_cast<double>(rate);
  const std::string paced = rate > 0 ? ", paced at " + std::to_string(rate) + " a second" : "";
  const double two = ZmqFloor(true, ipc, static_cast<size_t>(bytes), static_cast<int>(messages),
                              r_msgs, &got, &two_cpu);
  std::printf("zmq two hops   %9.1f MB/s  %9.1f msg/s  (%d messages of %lld bytes, %s%s)\n", two,
              two * 1e6 / static_cast<double>(bytes), got, static_cast<long long>(bytes),
              transport.c_str(), paced.c_str());
  std::printf("               CPU us a message: producer %.0f, relay %.0f, consumer %.0f\n",
              two_cpu.producer_us, two_cpu.relay_us, two_cpu.consumer_us);
  const double one = ZmqFloor(false, ipc, static_cast<size_t>(bytes), static_cast<int>(messages),
                              r_msgs, &got, &one_cpu);
  std::printf("zmq one hop    %9.1f MB/s  %9.1f msg/s\n", one,
              one * 1e6 / static_cast<double>(bytes));
  std::printf("               CPU us a message: producer %.0f, consumer %.0f\n",
              one_cpu.producer_us, one_cpu.consumer_us);
  RedisRates r;
  if (!redis.empty()) {
    ferry::protocol::RedisEndpoint ep;
    ferry::Status s = ferry::protocol::ResolveRedisEndpoint(redis, redis_files, &ep);
    if (s.ok() && ep.tls)
      s = ferry::Status::InvalidArgument(
          "ferry-floor measures bare hiredis, which has no TLS here: use redis:// (ferry-bench "
          "takes rediss://)");
    if (!s.ok()) {
      std::fprintf(stderr, "ferry-floor: --redis: %s\n", s.ToString().c_str());
      return 2;
    }
    r = RedisFloor(ep, static_cast<size_t>(bytes), static_cast<int>(messages),
                   static_cast<int>(clients));
    if (r.ok) {
      // The server's CPU, unless it would not say (an ACL user without INFO).
      auto cpu = [](double us) {
        char text[48] = "";
        if (us >= 0) std::snprintf(text, sizeof(text), "  %6.0f us of Redis CPU a value", us);
        return std::string(text);
      };
      std::printf("redis SET      %9.1f MB/s  %9.1f values/s%s  (%lld connection(s))\n", r.set_mbps,
                  r.set_mbps * 1e6 / static_cast<double>(bytes), cpu(r.set_cpu_us).c_str(),
                  static_cast<long long>(clients));
      std::printf("redis GET      %9.1f MB/s  %9.1f values/s%s\n", r.get_mbps,
                  r.get_mbps * 1e6 / static_cast<double>(bytes), cpu(r.get_cpu_us).c_str());
    }
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f,
                 "{\"mode\": \"floor\", \"bytes\": %lld, \"messages\": %lld, \"clients\": %lld, "
                 "\"rate\": %lld, \"transport\": \"%s\", \"zmq_two_hops_mbps\": %.1f, "
                 "\"zmq_one_hop_mbps\": %.1f",
                 static_cast<long long>(bytes), static_cast<long long>(messages),
                 static_cast<long long>(clients), static_cast<long long>(rate), transport.c_str(),
                 two, one);
    std::fprintf(f,
                 ", \"zmq_two_hops_cpu_us\": {\"producer\": %.1f, \"relay\": %.1f, "
                 "\"consumer\": %.1f}, \"zmq_one_hop_cpu_us\": {\"producer\": %.1f, "
                 "\"consumer\": %.1f}",
                 two_cpu.producer_us, two_cpu.relay_us, two_cpu.consumer_us, one_cpu.producer_us,
                 one_cpu.consumer_us);
    if (r.ok)
      std::fprintf(f,
                   ", \"redis_set_mbps\": %.1f, \"redis_get_mbps\": %.1f, "
                   "\"redis_set_cpu_us\": %.1f, \"redis_get_cpu_us\": %.1f",
                   r.set_mbps, r.get_mbps, r.set_cpu_us, r.get_cpu_us);
    std::fprintf(f, "}\n");
    std::fclose(f);
  }
  return two > 0 && one > 0 ? 0 : 1;
}
