// Prometheus exposition text as `ferry top` reads it when it scrapes a broker's or a worker's
// /metrics endpoint: metrics/src/text_format.cc ParseText, then what `ferry top` computes from
// two scrapes (producer-sdk/cli/fleet_view.cc ComputeIntervalMetrics: histogram buckets,
// quantiles, sums).
#include <string>
#include <vector>

#include "ferry/metrics/text_format.h"
#include "fleet_view.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::cli::Scrape scrape;
  scrape.url = "http://worker:9100/metrics";
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!ferry::metrics::ParseText(text, &scrape.parsed).ok()) return 0;
  scrape.ok = true;
  const std::vector<ferry::cli::Scrape> scrapes = {scrape};
  (void)ferry::cli::ComputeIntervalMetrics(scrapes, scrapes, 1.0);
  return 0;
}
