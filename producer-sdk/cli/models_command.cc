// `ferry models`: the models the broker knows, the input specs their workers announced, and
// which workers serve each (the broker's STATS "models", docs/protocol.md).
#include <cstdio>

#include "commands.h"
#include "ferry/runtime/flags.h"
#include "fleet_view.h"
#include "ops_commands.h"

namespace ferry::cli {

int RunModels(std::vector<char*>& args) {
  BrokerFlags broker;
  runtime::FlagSet flags(
      "ferry models",
      "Lists the models the broker knows, the inputs each declares (dtype and shape per job,\n"
      "-1 = any size; the broker rejects jobs that do not match) and the workers serving it.\n"
      "A model whose workers declare different specs (a rolling upgrade) has a row per spec.");
  broker.Register(&flags);
  Status parsed = flags.Parse(static_cast<int>(args.size()), args.data());
  if (int rc = runtime::HandleFlagResult(flags, parsed); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "ferry models takes no arguments\n\n%s", flags.Usage().c_str());
    return kExitUsage;
  }
  std::unique_ptr<client::Client> c;
  if (Status s = broker.MakeClient(&c); !s.ok()) return FailWith(s);
  std::string json;
  if (Status s = c->Stats(&json); !s.ok()) return FailWith(s);
  FleetStats stats;
  if (Status s = ParseFleetStats(json, &stats); !s.ok()) return FailWith(s);
  std::fputs(FormatModels(stats, broker.frontend).c_str(), stdout);
  return kExitOk;
}

}  // namespace ferry::cli
