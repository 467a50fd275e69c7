// ferry::metrics under concurrent updates, registrations and scrapes: no lost updates.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "ferry/metrics/registry.h"
#include "ferry/metrics/text_format.h"

namespace ferry::metrics {
namespace {

constexpr int kThreads = 8;
constexpr int kPerThread = 50000;

TEST(MetricsConcurrency, CountersGaugesAndHistogramsLoseNoUpdates) {
  Registry r;
  Counter* c = r.Counter("ferry_c_total", "c");
  Counter* busy = r.Counter("ferry_busy_seconds_total", "b");
  Gauge* g = r.Gauge("ferry_g", "g");
  Histogram* h = r.Histogram("ferry_h", "h", {1, 2, 3});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c->Inc();
        busy->Add(0.5);
        g->Inc(t % 2 ? 1 : -1);
        h->Observe(i % 4);  // 0,1 -> le 1; 2 -> le 2; 3 -> le 3
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_DOUBLE_EQ(c->Value(), kThreads * kPerThread);
  EXPECT_DOUBLE_EQ(busy->Value(), kThreads * kPerThread * 0.5);
  EXPECT_DOUBLE_EQ(g->Value(), 0);
  Histogram::Snapshot s = h->Read();
  EXPECT_EQ(s.count, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(s.cumulative[0], static_cast<uint64_t>(kThreads * kPerThread / 2));
  EXPECT_DOUBLE_EQ(s.sum, kThreads * (kPerThread / 4) * (0 + 1 + 2 + 3));
}

// Threads register series (some the same, some new) and update them while another thread
// scrapes; every scrape parses, and the final totals are exact.
TEST(MetricsConcurrency, RegisterUpdateAndExposeAtOnce) {
  Registry r;
  std::atomic<bool> done{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (!done.load()) {
      ParsedText p;
      ASSERT_TRUE(ParseText(r.Expose(), &p).ok());
      // A scrape may land between updates, but cumulative buckets never decrease.
      std::map<double, double> b = HistogramBuckets(p, "ferry_lat_seconds");
      double last = 0;
      for (const auto& [le, n] : b) {
        EXPECT_GE(n, last);
        last = n;
      }
      scrapes.fetch_add(1);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        std::string model = "m" + std::to_string(i % 10);
        r.Counter("ferry_jobs_total", "j", {{"model", model}})->Inc();
        r.Counter("ferry_per_thread_total", "p", {{"thread", std::to_string(t)}})->Inc();
        r.Histogram("ferry_lat_seconds", "l", {0.1, 1}, {{"model", model}})->Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  scraper.join();
  EXPECT_GT(scrapes.load(), 0);
  EXPECT_EQ(r.registration_errors(), 0u);
  ParsedText p;
  ASSERT_TRUE(ParseText(r.Expose(), &p).ok());
  EXPECT_EQ(SumSamples(p, "ferry_jobs_total"), kThreads * 2000);
  EXPECT_EQ(SumSamples(p, "ferry_jobs_total", {{"model", "m3"}}), kThreads * 200);
  EXPECT_EQ(SumSamples(p, "ferry_per_thread_total", {{"thread", "5"}}), 2000);
  EXPECT_EQ(SumSamples(p, "ferry_lat_seconds_count"), kThreads * 2000);
}

}  // namespace
}  // namespace ferry::metrics
