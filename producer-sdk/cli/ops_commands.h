#pragma once
// The operator commands of the `ferry` tool (see `ferry COMMAND --help`):
//   ferry status   one-shot tables of the broker's workers, queues and counters
//   ferry top      the same, refreshing, with rates over the interval (q or Ctrl-C quits)
//   ferry models   the models, their declared input specs and the workers serving them
//   ferry up       a whole local fleet: redis-server, ferry-broker, one ferry-worker per GPU
// Each takes argv without the command word and returns the exit code (commands.h).

#include <memory>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/redis_endpoint.h"
#include "ferry/runtime/flags.h"

namespace ferry::cli {

int RunStatus(std::vector<char*>& args);
int RunTop(std::vector<char*>& args);
int RunModels(std::vector<char*>& args);  // models_command.cc
int RunUp(std::vector<char*>& args);

// The flags status/top share with the other commands (--frontend, --redis, ...).
struct BrokerFlags {
  std::string frontend = "tcp://127.0.0.1:5555";
  std::string redis = "redis://127.0.0.1:6379";
  std::string redis_prefix = "ferry:";
  int64_t request_timeout_ms = 5000;
  std::string curve_server_public;         // CURVE: the broker's .key
  std::string curve_secret;                // CURVE: this client's .key_secret
  protocol::RedisAccessFiles redis_files;  // --redis-password-file, --redis-tls-*
  bool consume_results = false;            // ClientOptions::consume_results (wait --consume)
  int64_t max_message_bytes = client::ClientOptions().max_message_bytes;  // the broker's limit

  void Register(runtime::FlagSet* f);
  Status MakeClient(std::unique_ptr<client::Client>* out) const;
};

// The exit code for a Status (commands.h lists them).
int ExitFor(const Status& s);
// Prints "ferry: <status>" to stderr and returns ExitFor(s).
int FailWith(const Status& s);

}  // namespace ferry::cli
