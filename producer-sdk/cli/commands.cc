#include "commands.h"

#include <filesystem>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/types.h"
#include "ferry/runtime/flags.h"
#include "ferry/runtime/version.h"
#include "npy.h"
#include "ops_commands.h"
#include "result_printer.h"
#include "tensor_files.h"

namespace ferry::cli {

int ExitFor(const Status& s) {
  if (s.ok()) return kExitOk;
  if (s.code() == codes::kInvalidArgument) return kExitUsage;
  if (s.code() == codes::kTimeout || s.retryable()) return kExitUnavailable;
  return kExitFailed;
}

namespace {

using runtime::FlagSet;

constexpr const char* kTopUsage =
    "usage: ferry COMMAND [flags]\n"
    "Submit inference jobs to a Ferry broker and read their results.\n"
    "\n"
    "commands:\n"
    "  submit --model NAME --input FILE [--input FILE ...]   submit one job, print its id\n"
    "  get ID                 print the result of a job (or 'pending')\n"
    "  wait ID                wait for a job's result, then print it\n"
    "  cancel ID [ID ...]     cancel jobs: queued ones end 'cancelled' at once\n"
    "  stats                  print the broker's statistics as JSON\n"
    "  status                 workers, queues and counters as tables\n"
    "  top                    a refreshing view of the fleet with rates (q or Ctrl-C quits)\n"
    "  models                 models, their input specs and the workers serving them\n"
    "  up --model NAME=PATH   a local fleet: redis-server, broker, one worker per GPU\n"
    "  keygen DIR NAME        a CURVE key pair: DIR/NAME.key and DIR/NAME.key_secret\n"
    "  --version              print the version\n"
    "\n"
    "flags of the producer commands (all but up and keygen): --frontend, --redis,\n"
    "  --redis-prefix, --request-timeout-ms, --curve-server-public, --curve-secret,\n"
    "  --redis-password-file, --redis-tls-ca, --redis-tls-cert, --redis-tls-key; their defaults\n"
    "  come from FERRY_FRONTEND, FERRY_REDIS, FERRY_REDIS_PREFIX, FERRY_CURVE_*,\n"
    "  FERRY_REDIS_PASSWORD_FILE and FERRY_REDIS_TLS_* when set (what `ferry up --env-file`\n"
    "  writes; `up` itself never reads them)\n"
    "`ferry COMMAND --help` lists a command's flags.\n"
    "\n"
    "exit codes: 0 done/ok, 1 failed/expired/cancelled/rejected, 2 usage or bad input,\n"
    "            3 timeout/unavailable/queue full, 4 no result yet (get)\n";

// --frontend, --redis, --redis-prefix, --request-timeout-ms (ops_commands.h).
using GlobalFlags = BrokerFlags;

int Fail(const Status& s) { return FailWith(s); }

// Parses flags; returns -1 to go on, else the exit code.
int ParseFlags(FlagSet* flags, std::vector<char*>& args) {
  Status s = flags->Parse(static_cast<int>(args.size()), args.data());
  return runtime::HandleFlagResult(*flags, s);
}

// Prints a final result (and writes its outputs as .npy under out_dir); exit code by state.
int PrintResult(const Result& r, const std::string& out_dir) {
  std::fputs(FormatResult(r).c_str(), stdout);
  if (!out_dir.empty() && !r.outputs.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);  // with its parents; fine if it exists
    if (ec)
      return Fail(
          Status::InvalidArgument("--out-npy " + out_dir + ": cannot create: " + ec.message()));
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      std::string npy, path = out_dir + "/" + r.id + "." + std::to_string(i) + ".npy";
      Status s = EncodeNpy(r.outputs[i], &npy);
      if (s.ok()) s = WriteFile(path, npy);
      if (!s.ok()) return Fail(s);
      std::printf("wrote %s\n", path.c_str());
    }
  }
  switch (r.state) {
    case JobState::kDone:
      return kExitOk;
    case JobState::kPending:
      return kExitPending;
    default:
      return kExitFailed;
  }
}

// Picks the i-th of a flag's values: one value applies to every input.
Status PickPerInput(const std::vector<std::string>& values, size_t n, size_t i,
                    const std::string& fallback, const std::string& flag, std::string* out) {
  if (values.empty())
    *out = fallback;
  else if (values.size() == 1)
    *out = values[0];
  else if (values.size() == n)
    *out = values[i];
  else
    return Status::InvalidArgument("give --" + flag + " once, or once per --input");
  return Status::Ok();
}

int RunSubmit(std::vector<char*>& args) {
  GlobalFlags global;
  std::string model, id, out_dir;
  std::vector<std::string> inputs, dtypes, shapes;
  int64_t priority = 0, timeout_ms = 0, result_ttl_s = 0, wait_timeout_ms = 30000;
  bool wait = false;
  FlagSet flags("ferry submit", "Submits one job and prints its id (and its result with --wait).");
  flags.String("model", &model, "the model to run (required)");
  flags.Repeated("input", &inputs,
                 "an input tensor file: .npy, or raw bytes (see --dtype/--shape)");
  flags.Repeated("dtype", &dtypes, "dtype of raw --input files (float32 if not given)");
  flags.Repeated("shape", &shapes, "shape of raw --input files, e.g. 1,8 (default: 1-D)");
  flags.String("id", &id, "the job id (default: a new UUID)");
  flags.Int("priority", &priority, "higher runs first");
  flags.Int("timeout-ms", &timeout_ms,
            "expire the job if not started within this long (0 = never)");
  flags.Int("result-ttl-s", &result_ttl_s, "keep the result this long (0 = broker default)");
  flags.Bool("wait", &wait, "wait for the result and print it");
  flags.Int("wait-timeout-ms", &wait_timeout_ms,
            "with --wait: give up after this long (-1 = never)");
  flags.String("out-npy", &out_dir,
               "with --wait: write outputs as DIR/<id>.<i>.npy (DIR is created)");
  flags.Bool("consume", &global.consume_results,
             "with --wait: delete the result from Redis once read");
  global.Register(&flags);
  if (int rc = ParseFlags(&flags, args); rc >= 0) return rc;
  if (model.empty() || inputs.empty() || !flags.positional().empty()) {
    std::fprintf(stderr, "ferry submit needs --model and at least one --input\n\n%s",
                 flags.Usage().c_str());
    return kExitUsage;
  }

  if (wait_timeout_ms < -1 || wait_timeout_ms > INT32_MAX) {
    std::fprintf(stderr, "ferry submit: --wait-timeout-ms must be -1..%d\n", INT32_MAX);
    return kExitUsage;
  }
  client::Job job;
  job.id = id;
  job.model = model;
  job.priority = priority;
  job.timeout_ms = timeout_ms;
  job.result_ttl_s = result_ttl_s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string dtype, shape;
    Status s = PickPerInput(dtypes, inputs.size(), i, "float32", "dtype", &dtype);
    if (s.ok()) s = PickPerInput(shapes, inputs.size(), i, "", "shape", &shape);
    Tensor t;
    if (s.ok()) s = ReadTensorFile(inputs[i], dtype, shape, &t);
    if (!s.ok()) return Fail(s);
    job.inputs.push_back(std::move(t));
  }

  std::unique_ptr<client::Client> c;
  if (Status s = global.MakeClient(&c); !s.ok()) return Fail(s);
  std::string job_id;
  Status s = c->Submit(job, &job_id);
  if (!s.ok()) {
    std::fprintf(stderr, "ferry: job %s not accepted: %s\n", job_id.c_str(), s.ToString().c_str());
    return s.code() == codes::kInvalidArgument ? kExitUsage : ExitFor(s);
  }
  std::printf("%s\n", job_id.c_str());
  if (!wait) return kExitOk;
  std::fflush(stdout);
  Result r;
  s = c->Wait(job_id, static_cast<int>(wait_timeout_ms), &r);
  if (!s.ok()) return Fail(s);
  return PrintResult(r, out_dir);
}

// `get ID` and `wait ID`.
int RunGetOrWait(std::vector<char*>& args, bool wait) {
  GlobalFlags global;
  std::string out_dir;
  int64_t timeout_ms = 30000;
  bool consume = false;
  FlagSet flags(wait ? "ferry wait ID" : "ferry get ID",
                wait ? "Waits for a job's result and prints it. Redis cannot tell a pending job "
                       "from an unknown id (mistyped, another --redis or --redis-prefix) or a "
                       "result that expired or was consumed: all of them wait until "
                       "--timeout-ms (exit 3)."
                     : "Prints a job's result, or 'pending' when there is none yet (also for an "
                       "id Redis has no result for: unknown, expired or consumed).");
  if (wait) {
    flags.Int("timeout-ms", &timeout_ms, "give up after this long (-1 = never)");
    flags.Bool("consume", &consume,
               "delete the result from Redis once read: a later get/wait finds none");
  }
  flags.String("out-npy", &out_dir, "also write the outputs as DIR/<id>.<i>.npy (DIR is created)");
  global.Register(&flags);
  if (int rc = ParseFlags(&flags, args); rc >= 0) return rc;
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "%s needs exactly one job id\n\n%s", wait ? "ferry wait" : "ferry get",
                 flags.Usage().c_str());
    return kExitUsage;
  }
  const std::string& id = flags.positional()[0];
  if (!protocol::IsValidJobId(id)) {
    std::fprintf(stderr,
                 "ferry: \"%s\" is not a job id: ids are 1-128 characters of A-Z a-z 0-9 . _ : "
                 "-\n",
                 id.c_str());
    return kExitUsage;
  }
  if (timeout_ms < -1 || timeout_ms > INT32_MAX) {
    std::fprintf(stderr, "ferry wait: --timeout-ms must be -1..%d\n", INT32_MAX);
    return kExitUsage;
  }
  global.consume_results = consume;
  std::unique_ptr<client::Client> c;
  if (Status s = global.MakeClient(&c); !s.ok()) return Fail(s);
  Result r;
  Status s = wait ? c->Wait(id, static_cast<int>(timeout_ms), &r) : c->Poll(id, &r);
  if (s.code() == codes::kTimeout) {
    std::fprintf(stderr,
                 "ferry: no result for %s within %lld ms: the job is still pending, or this "
                 "fleet does not know the id (mistyped; another --redis or --redis-prefix), or "
                 "its result expired or was consumed\n",
                 id.c_str(), static_cast<long long>(timeout_ms));
    return kExitUnavailable;
  }
  if (!s.ok()) return Fail(s);
  return PrintResult(r, out_dir);
}

// `cancel ID [ID ...]`: one line per id; exit 1 when some id was not pending.
int RunCancel(std::vector<char*>& args) {
  GlobalFlags global;
  FlagSet flags("ferry cancel ID [ID ...]",
                "Cancels jobs. Prints one line per id: cancelled (it was queued; its result is\n"
                "now 'cancelled'), running (on a worker; dropped there unless its batch has\n"
                "started) or not_found (unknown, finished or expired).");
  global.Register(&flags);
  if (int rc = ParseFlags(&flags, args); rc >= 0) return rc;
  if (flags.positional().empty()) {
    std::fprintf(stderr, "ferry cancel needs at least one job id\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  std::unique_ptr<client::Client> c;
  if (Status s = global.MakeClient(&c); !s.ok()) return Fail(s);
  client::CancelReport report;
  if (Status s = c->CancelMany(flags.positional(), &report); !s.ok()) return Fail(s);
  for (const auto& id : report.cancelled) std::printf("cancelled %s\n", id.c_str());
  for (const auto& id : report.running) std::printf("running %s\n", id.c_str());
  for (const auto& id : report.not_found) std::printf("not_found %s\n", id.c_str());
  return report.not_found.empty() ? kExitOk : kExitFailed;
}

int RunStats(std::vector<char*>& args) {
  GlobalFlags global;
  FlagSet flags("ferry stats", "Prints the broker's statistics (workers, queues) as JSON.");
  global.Register(&flags);
  if (int rc = ParseFlags(&flags, args); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "ferry stats takes no arguments\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  std::unique_ptr<client::Client> c;
  if (Status s = global.MakeClient(&c); !s.ok()) return Fail(s);
  std::string json;
  if (Status s = c->Stats(&json); !s.ok()) return Fail(s);
  std::printf("%s\n", json.c_str());
  return kExitOk;
}

// ferry keygen DIR NAME: a CURVE key pair as ZeroMQ certificates (docs/security.md).
int RunKeygen(std::vector<char*>& args) {
  FlagSet flags("ferry keygen",
                "Writes a CurveZMQ key pair: DIR/NAME.key (the public certificate, to give to "
                "the broker or its clients) and DIR/NAME.key_secret (mode 0600, kept by its "
                "owner). The files are czmq/pyzmq certificates. Existing files are never "
                "overwritten.\nusage: ferry keygen DIR NAME");
  if (int rc = ParseFlags(&flags, args); rc >= 0) return rc;
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "ferry keygen needs DIR and NAME\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  const std::string dir = flags.positional()[0], name = flags.positional()[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail(Status::InvalidArgument("cannot create " + dir + ": " + ec.message()));
  protocol::CurveKeyPair keys;
  if (Status s = protocol::GenerateCurveKeyPair(&keys); !s.ok()) return Fail(s);
  if (Status s = protocol::WriteCertificates(dir, name, keys); !s.ok()) return Fail(s);
  std::printf("%s/%s.key\n%s/%s.key_secret\n", dir.c_str(), name.c_str(), dir.c_str(),
              name.c_str());
  return kExitOk;
}

// Index of the command word: the first argument that is neither a flag nor a flag's value.
int FindCommand(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 && a != "-h") return i;
    bool takes_value = a.find('=') == std::string::npos && a != "--wait" && a != "--help" &&
                       a != "-h" && a != "--version" && a != "--consume";
    if (takes_value) ++i;
  }
  return -1;
}

}  // namespace

int RunCli(int argc, char** argv) {
  int at = FindCommand(argc, argv);
  if (at < 0) {
    bool help = false;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--version") {
        std::printf("%s\n", runtime::VersionLine("ferry").c_str());
        return kExitOk;
      }
      help |= std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
    }
    std::fputs(kTopUsage, help ? stdout : stderr);
    return help ? kExitOk : kExitUsage;
  }
  std::string command = argv[at];
  std::vector<char*> args;  // argv without the command word
  for (int i = 0; i < argc; ++i) {
    if (i != at) args.push_back(argv[i]);
  }
  if (command == "submit") return RunSubmit(args);
  if (command == "get") return RunGetOrWait(args, /*wait=*/false);
  if (command == "wait") return RunGetOrWait(args, /*wait=*/true);
  if (command == "cancel") return RunCancel(args);
  if (command == "stats") return RunStats(args);
  if (command == "status") return RunStatus(args);
  if (command == "top") return RunTop(args);
  if (command == "models") return RunModels(args);
  if (command == "up") return RunUp(args);
  if (command == "keygen") return RunKeygen(args);
  if (command == "help") {
    std::fputs(kTopUsage, stdout);
    return kExitOk;
  }
  std::fprintf(stderr, "ferry: unknown command \"%s\"\n\n%s", command.c_str(), kTopUsage);
  return kExitUsage;
}

}  // namespace ferry::cli
