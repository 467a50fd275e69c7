// Test helpers for the metrics tests: scraping a /metrics endpoint, and the one `tiny` job.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ferry/client.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/text_format.h"
#include "fleet.h"
#include "reference.h"

namespace ferry::testutil {

struct Scraper {
  std::string url;
  metrics::ParsedText last;
  bool Scrape() {
    std::string body;
    if (!metrics::HttpGet(url, 2000, &body).ok()) return false;
    last = metrics::ParsedText();
    return metrics::ParseText(body, &last).ok();
  }
  double Sum(const std::string& name, const std::map<std::string, std::string>& match = {}) {
    return metrics::SumSamples(last, name, match);
  }
  // Scrapes until `name`{match} == value (true) or 30 s pass (false; `last` is the last scrape).
  bool WaitFor(const std::string& name, const std::map<std::string, std::string>& match,
               double value) {
    return testutil::WaitFor([&] { return Scrape() && Sum(name, match) == value; });
  }
};

inline std::string Url(int port, const std::string& path) {
  return "http://127.0.0.1:" + std::to_string(port) + path;
}

inline client::Job TinyJob(uint32_t seed, std::vector<int64_t> shape = {8}) {
  client::Job j;
  j.model = "tiny";
  j.inputs = {testutil::RandomFloats(shape, seed)};
  return j;
}

}  // namespace ferry::testutil
