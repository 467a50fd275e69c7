// The broker's STATS reply as `ferry status` / `ferry top` read it: the msgpack body, rendered
// as JSON by the SDK (producer-sdk/src/client.cc, Client::Stats: protocol::ToJson), then the
// CLI's JSON reader (producer-sdk/cli/json.cc), ParseFleetStats and the tables it prints
// (fleet_view.cc). The raw input is also fed to ParseFleetStats as JSON text.
#include <string>

#include "ferry/protocol/codec.h"
#include "fleet_view.h"
#include "fuzz_check.h"

namespace {

void Show(const std::string& json) {
  ferry::cli::FleetStats stats;
  if (!ferry::cli::ParseFleetStats(json, &stats).ok()) return;
  (void)ferry::cli::FormatStatus(stats, "tcp://broker:5555");
  (void)ferry::cli::FormatTop(stats, stats, 1.0, ferry::cli::IntervalMetrics(),
                              "tcp://broker:5555");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msgpack::object_handle oh;
  if (ferry::protocol::UnpackMap(data, size, &oh).ok()) Show(ferry::protocol::ToJson(oh.get()));
  Show(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
