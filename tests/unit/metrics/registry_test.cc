// ferry::metrics::Registry: series identity, labels, misuse, Remove, and the names header.
#include <gtest/gtest.h>

#include <cmath>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "ferry/metrics/text_format.h"

namespace ferry::metrics {
namespace {

TEST(MetricsRegistry, SameNameAndLabelsGiveTheSameSeriesInAnyLabelOrder) {
  Registry r;
  Counter* a = r.Counter("ferry_x_total", "x", {{"model", "m"}, {"status", "done"}});
  Counter* b = r.Counter("ferry_x_total", "x", {{"status", "done"}, {"model", "m"}});
  Counter* c = r.Counter("ferry_x_total", "x", {{"model", "other"}, {"status", "done"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Inc();
  b->Inc(4);
  a->Add(0.5);
  a->Add(-3);  // ignored: counters never go down
  EXPECT_DOUBLE_EQ(a->Value(), 5.5);
  EXPECT_DOUBLE_EQ(c->Value(), 0);
  EXPECT_EQ(r.registration_errors(), 0u);
}

TEST(MetricsRegistry, GaugeMovesBothWays) {
  Registry r;
  Gauge* g = r.Gauge("ferry_g", "g");
  g->Set(10);
  g->Inc();
  g->Dec(2.5);
  EXPECT_DOUBLE_EQ(g->Value(), 8.5);
}

TEST(MetricsRegistry, HistogramCountsIntoLeBuckets) {
  Registry r;
  Histogram* h = r.Histogram("ferry_h_seconds", "h", {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 1.0, 5.0, 100.0}) h->Observe(v);
  h->Observe(std::nan(""));  // ignored
  Histogram::Snapshot s = h->Read();
  ASSERT_EQ(s.cumulative.size(), 4u);
  EXPECT_EQ(s.cumulative[0], 2u);  // 0.05, 0.1 (le is inclusive)
  EXPECT_EQ(s.cumulative[1], 4u);
  EXPECT_EQ(s.cumulative[2], 5u);
  EXPECT_EQ(s.cumulative[3], 6u);
  EXPECT_EQ(s.count, 6u);
  EXPECT_DOUBLE_EQ(s.sum, 106.65);
}

TEST(MetricsRegistry, MisuseGivesWorkingDetachedSeriesAndCountsErrors) {
  Registry r;
  r.Counter("ferry_dup", "d")->Inc();
  Gauge* wrong_type = r.Gauge("ferry_dup", "d");
  ASSERT_NE(wrong_type, nullptr);
  wrong_type->Set(3);  // works, but is not exposed
  ASSERT_NE(r.Counter("0bad name", "x"), nullptr);
  ASSERT_NE(r.Counter("ferry_ok_total", "x", {{"bad-label", "v"}}), nullptr);
  ASSERT_NE(r.Counter("ferry_ok_total", "x", {{"a", "1"}, {"a", "2"}}), nullptr);
  ASSERT_NE(r.Histogram("ferry_h", "x", {1, 2}, {{"le", "1"}}), nullptr);
  ASSERT_NE(r.Histogram("ferry_h2", "x", {2, 1}), nullptr);
  r.Histogram("ferry_h3", "x", {1, 2});
  Histogram* other = r.Histogram("ferry_h3", "x", {1, 2, 3}, {{"model", "m"}});
  other->Observe(1);
  EXPECT_EQ(r.registration_errors(), 7u);
  EXPECT_NE(r.last_error().find("ferry_h3"), std::string::npos);
  std::string text = r.Expose();
  EXPECT_EQ(text.find("gauge"), std::string::npos) << text;
  EXPECT_EQ(text.find("ferry_ok_total"), std::string::npos) << text;
  EXPECT_NE(text.find("ferry_dup 1\n"), std::string::npos) << text;
}

TEST(MetricsRegistry, RemoveDropsTheSeries) {
  Registry r;
  r.Gauge("ferry_worker_credit", "c", {{"worker", "a"}})->Set(1);
  r.Gauge("ferry_worker_credit", "c", {{"worker", "b"}})->Set(2);
  EXPECT_TRUE(r.Remove("ferry_worker_credit", {{"worker", "a"}}));
  EXPECT_FALSE(r.Remove("ferry_worker_credit", {{"worker", "a"}}));
  EXPECT_FALSE(r.Remove("ferry_nothing", {}));
  std::string text = r.Expose();
  EXPECT_EQ(text.find("worker=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("ferry_worker_credit{worker=\"b\"} 2\n"), std::string::npos) << text;
  EXPECT_TRUE(r.Remove("ferry_worker_credit", {{"worker", "b"}}));
  EXPECT_EQ(r.Expose(), "");  // a family with no series is left out
}

TEST(MetricsRegistry, NameValidation) {
  EXPECT_TRUE(IsValidMetricName("ferry_jobs_total"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_TRUE(IsValidLabelName("model"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
}

// Every name in names.h registers cleanly with its type and follows the conventions.
TEST(MetricsNames, AllNamesRegisterAndFollowConventions) {
  using namespace names;
  Registry r;
  const std::vector<const char*> counters = {
      kJobsAccepted,   kJobsRejected,     kJobsFinished,         kJobsRequeued,
      kJobsDispatched, kChunksDispatched, kDuplicatesSuppressed, kExecutorBusy,
      kBatches,        kWorkerJobs,       kResultWriteErrors};
  const std::vector<const char*> gauges = {kQueueDepth,       kQueueOldestAge,     kJobsPending,
                                           kWorkersConnected, kWorkerCredit,       kWorkerInFlight,
                                           kWorkerInfo,       kModelResident,      kModelsResident,
                                           kDeviceMemoryUsed, kDeviceMemoryBudget, kExecutors};
  for (const char* n : counters) {
    EXPECT_TRUE(std::string(n).size() > 6 &&
                std::string(n).rfind("_total") == std::string(n).size() - 6)
        << n;
    r.Counter(n, "help")->Inc();
  }
  for (const char* n : gauges) r.Gauge(n, "help")->Set(1);
  r.Histogram(kJobLatency, kJobLatencyHelp, LatencyBuckets(), {{kLabelModel, "m"}})->Observe(0.01);
  r.Histogram(kJobQueueTime, kJobQueueTimeHelp, LatencyBuckets())->Observe(0.01);
  r.Histogram(kJobComputeTime, kJobComputeTimeHelp, LatencyBuckets())->Observe(0.01);
  r.Histogram(kBatchSize, kBatchSizeHelp, BatchSizeBuckets())->Observe(8);
  RegisterProcessInfo(&r, "broker", "0.1.0");
  EXPECT_EQ(r.registration_errors(), 0u) << r.last_error();
  for (const char* n : {kQueueOldestAge, kJobLatency, kJobQueueTime, kJobComputeTime})
    EXPECT_NE(std::string(n).find("_seconds"), std::string::npos) << n;
  for (const char* n : {kDeviceMemoryUsed, kDeviceMemoryBudget})
    EXPECT_NE(std::string(n).find("_bytes"), std::string::npos) << n;
  ParsedText parsed;
  ASSERT_TRUE(ParseText(r.Expose(), &parsed).ok());
  EXPECT_EQ(parsed.types.size(), counters.size() + gauges.size() + 4 + 2);
}

}  // namespace
}  // namespace ferry::metrics
