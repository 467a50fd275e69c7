// The Prometheus text format: Registry::Expose parsed back, escaping, values, quantiles.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ferry/metrics/registry.h"
#include "ferry/metrics/text_format.h"

namespace ferry::metrics {
namespace {

TEST(MetricsTextFormat, ExposeParsesBackWithTypesHelpAndValues) {
  Registry r;
  r.Counter("ferry_jobs_accepted_total", "Jobs accepted.", {{"model", "tiny"}})->Inc(3);
  r.Counter("ferry_jobs_accepted_total", "Jobs accepted.", {{"model", "big"}})->Inc(1);
  r.Gauge("ferry_queue_depth", "Queued.\nSecond line \\ backslash", {{"model", "tiny"}})->Set(7);
  Histogram* h =
      r.Histogram("ferry_job_latency_seconds", "Latency.", {0.01, 0.1, 1}, {{"model", "tiny"}});
  h->Observe(0.005);
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);

  std::string text = r.Expose();
  ParsedText p;
  ASSERT_TRUE(ParseText(text, &p).ok()) << text;
  EXPECT_EQ(p.types["ferry_jobs_accepted_total"], "counter");
  EXPECT_EQ(p.types["ferry_queue_depth"], "gauge");
  EXPECT_EQ(p.types["ferry_job_latency_seconds"], "histogram");
  EXPECT_EQ(p.help["ferry_queue_depth"], "Queued.\nSecond line \\ backslash");
  EXPECT_EQ(SumSamples(p, "ferry_jobs_accepted_total"), 4);
  EXPECT_EQ(SumSamples(p, "ferry_jobs_accepted_total", {{"model", "tiny"}}), 3);
  EXPECT_EQ(SumSamples(p, "ferry_queue_depth", {{"model", "tiny"}}), 7);

  // Histogram series: cumulative buckets ending in +Inf == _count, then _sum and _count.
  std::map<double, double> b = HistogramBuckets(p, "ferry_job_latency_seconds");
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0.01], 1);
  EXPECT_EQ(b[0.1], 2);
  EXPECT_EQ(b[1], 3);
  EXPECT_EQ(b[std::numeric_limits<double>::infinity()], 4);
  EXPECT_EQ(SumSamples(p, "ferry_job_latency_seconds_count"), 4);
  EXPECT_DOUBLE_EQ(SumSamples(p, "ferry_job_latency_seconds_sum"), 5.555);
  EXPECT_NE(text.find("ferry_job_latency_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 4\n"),
            std::string::npos)
      << text;

  // Every sample belongs to a family declared (HELP + TYPE) before it, families in name order.
  std::string last_family;
  for (const Sample& s : p.samples) {
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      std::string sf = suffix;
      if (!p.types.count(family) && family.size() > sf.size() &&
          family.compare(family.size() - sf.size(), sf.size(), sf) == 0)
        family = family.substr(0, family.size() - sf.size());
    }
    EXPECT_TRUE(p.types.count(family)) << s.name;
    EXPECT_TRUE(p.help.count(family)) << s.name;
    EXPECT_GE(family, last_family);
    last_family = family;
  }
}

TEST(MetricsTextFormat, LabelValuesAreEscapedAndRoundTrip) {
  Registry r;
  std::string nasty = "a \"quoted\" \\ back\nslash";
  r.Gauge("ferry_g", "g", {{"model", nasty}})->Set(1);
  std::string text = r.Expose();
  EXPECT_NE(text.find("model=\"a \\\"quoted\\\" \\\\ back\\nslash\""), std::string::npos) << text;
  ParsedText p;
  ASSERT_TRUE(ParseText(text, &p).ok());
  ASSERT_EQ(p.samples.size(), 1u);
  EXPECT_EQ(p.samples[0].labels["model"], nasty);
}

TEST(MetricsTextFormat, FormatValue) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(0.0005), "0.0005");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  double third = 1.0 / 3;
  EXPECT_EQ(std::strtod(FormatValue(third).c_str(), nullptr), third);
}

TEST(MetricsTextFormat, ParserAcceptsForeignExpositionAndRejectsGarbage) {
  ParsedText p;
  ASSERT_TRUE(ParseText("# a comment\n\nup 1\nhttp_requests_total{method=\"post\",code=\"200\"} "
                        "1027 1395066363000\nx_bucket{le=\"+Inf\"} 3\nnan_metric NaN\r\n",
                        &p)
                  .ok());
  ASSERT_EQ(p.samples.size(), 4u);
  EXPECT_EQ(p.samples[1].labels["code"], "200");
  EXPECT_EQ(p.samples[1].value, 1027);
  EXPECT_TRUE(std::isnan(p.samples[3].value));
  for (const char* bad :
       {"name_only\n", "m{a=\"1\" 1\n", "m{a=1} 2\n", "m one\n", "{} 1\n", "m 1 2 3\n"}) {
    Status s = ParseText(bad, &p);
    EXPECT_EQ(s.code(), "malformed") << bad;
  }
}

TEST(MetricsTextFormat, HistogramQuantileInterpolatesLikePromQL) {
  const double inf = std::numeric_limits<double>::infinity();
  std::map<double, double> b = {{0.1, 50}, {0.2, 90}, {0.4, 100}, {inf, 100}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, b), 0.1);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.25, b), 0.05);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.7, b), 0.15);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.95, b), 0.3);
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{0.1, 0}, {inf, 0}})));
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.99, {{0.1, 1}, {inf, 100}}), 0.1);  // in +Inf
}

}  // namespace
}  // namespace ferry::metrics
