#pragma once
// The Prometheus text exposition format (0.0.4): value formatting and escaping used by
// Registry::Expose, and a parser for what it (or any exporter) writes -- used by the tests and by
// `ferry top`, which scrapes /metrics to show latency percentiles and busy time.

#include <map>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::metrics {

// "+Inf", "-Inf", "NaN", an integer when the value is integral (up to 2^53), else the shortest
// decimal that reads back as the same double.
std::string FormatValue(double value);
// Label values escape \ " and newline; HELP text escapes \ and newline.
std::string EscapeLabelValue(const std::string& value);
std::string EscapeHelp(const std::string& help);

struct Sample {
  std::string name;                           // e.g. ferry_job_latency_seconds_bucket
  std::map<std::string, std::string> labels;  // unescaped
  double value = 0.0;
};

struct ParsedText {
  std::vector<Sample> samples;               // in the order read
  std::map<std::string, std::string> types;  // family name -> counter|gauge|histogram|...
  std::map<std::string, std::string> help;   // family name -> unescaped help text
};

// Parses exposition text. Fails with malformed (and the line number) on a line that is not a
// comment, a blank line or a well-formed sample; timestamps after the value are accepted.
Status ParseText(const std::string& text, ParsedText* out);

// The sum of the samples named `name` whose labels include every pair of `match` (e.g. all
// models: {}; one model: {{"model", "tiny"}}). 0 when none match.
double SumSamples(const ParsedText& parsed, const std::string& name,
                  const std::map<std::string, std::string>& match = {});

// Cumulative buckets of histogram family `family` (samples `family`_bucket), summed over the
// series matching `match`: upper bound ("le", +Inf as infinity) -> cumulative count.
std::map<double, double> HistogramBuckets(const ParsedText& parsed, const std::string& family,
                                          const std::map<std::string, std::string>& match = {});

// The q-quantile (0 <= q <= 1) of cumulative buckets, interpolating linearly inside the bucket
// like PromQL's histogram_quantile. NaN when there are no observations; the largest finite bound
// when the quantile falls in the +Inf bucket.
double HistogramQuantile(double q, const std::map<double, double>& cumulative);

}  // namespace ferry::metrics
