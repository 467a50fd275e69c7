// `ferry status`/`top` rendering from canned STATS JSON and canned /metrics scrapes.
#include <gtest/gtest.h>

#include "ferry/metrics/names.h"
#include "ferry/metrics/registry.h"
#include "fleet_view.h"
#include "json.h"

namespace ferry::cli {
namespace {

const char* kStats = R"({"workers": [
  {"id": "h:2:cuda:1", "device": "cuda:1", "host": "h", "pid": 2, "models": ["tiny", "big"],
   "capacity": 64, "credit": 60, "in_flight": 4, "last_seen_ms": 250},
  {"id": "h:1:cuda:0", "device": "cuda:0", "host": "h", "pid": 1, "models": ["tiny"],
   "capacity": 64, "credit": 64, "in_flight": 0, "last_seen_ms": 1500}],
 "queues": {"tiny": 12, "big": 0}, "pending": 16,
 "counters": {"accepted": 100, "rejected": 2, "finished": 84, "requeued": 1, "chunks": 9,
              "dispatched": 90, "poisoned": 0}, "rid": 7})";

TEST(FleetView, ParsesStatsJson) {
  FleetStats s;
  ASSERT_TRUE(ParseFleetStats(kStats, &s).ok());
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_EQ(s.workers[0].id, "h:1:cuda:0");  // sorted by id
  EXPECT_EQ(s.workers[1].models, (std::vector<std::string>{"tiny", "big"}));
  EXPECT_EQ(s.workers[1].in_flight, 4);
  EXPECT_EQ(s.queues.at("tiny"), 12);
  EXPECT_EQ(s.pending, 16);
  EXPECT_EQ(s.counters.at("finished"), 84);
  EXPECT_EQ(ParseFleetStats("[1,2]", &s).code(), "malformed");
  EXPECT_EQ(ParseFleetStats("{\"workers\": [", &s).code(), "malformed");
}

// `ferry models` from STATS "models": a row per model and spec, the workers of each.
TEST(FleetView, ModelsListTheirSpecsAndWorkers) {
  FleetStats s;
  ASSERT_TRUE(ParseFleetStats(R"({"models": {
      "asr": {"specs": [
        {"inputs": [{"name": "mel", "dtype": "float32", "shape": [-1, 80]},
                    {"dtype": "int64", "shape": []}], "workers": ["h:2:cpu", "h:1:cpu"]},
        {"inputs": [{"dtype": "int16", "shape": [-1]}], "workers": []}]},
      "tiny": {"specs": [{"workers": ["h:1:cpu"]}]},
      "gone": {"specs": []}},
    "workers": [], "queues": {}, "pending": 0, "counters": {}})",
                              &s)
                  .ok());
  ASSERT_EQ(s.models.size(), 3u);
  const auto& asr = s.models.at("asr");
  ASSERT_EQ(asr.size(), 2u);
  EXPECT_TRUE(asr[0].declared);
  EXPECT_EQ(asr[0].inputs, "mel: float32 [-1, 80], 1: int64 []");
  EXPECT_EQ(asr[0].workers, (std::vector<std::string>{"h:1:cpu", "h:2:cpu"}));
  EXPECT_EQ(asr[1].inputs, "0: int16 [-1]");
  EXPECT_FALSE(s.models.at("tiny")[0].declared);

  const std::string text = FormatModels(s, "tcp://b:5555");
  EXPECT_NE(text.find("broker tcp://b:5555: 3 model(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("MODEL  INPUTS"), std::string::npos) << text;
  EXPECT_NE(text.find("asr    mel: float32 [-1, 80], 1: int64 []  h:1:cpu,h:2:cpu"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("0: int16 [-1]"), std::string::npos) << text;
  EXPECT_NE(text.find("(none now; still checked)"), std::string::npos) << text;
  EXPECT_NE(text.find("tiny   (not declared: any inputs)"), std::string::npos) << text;
  EXPECT_NE(text.find("several specs"), std::string::npos) << text;
  EXPECT_NE(FormatModels(FleetStats(), "e").find("no model announced yet"), std::string::npos);
}

// Found by tests/fuzz/fuzz_stats: a number no int64 holds (1e400 is inf to the JSON reader)
// was cast to int64 (undefined behaviour). Counts are clamped to +-2^53; NaN-free.
TEST(FleetView, OutOfRangeNumbersAreClamped) {
  FleetStats s;
  ASSERT_TRUE(ParseFleetStats(R"({"workers": [{"id": "w", "pid": 1e400, "credit": -1e400,
                                   "last_seen_ms": 1e300}],
                                  "queues": {"tiny": 1e19}, "pending": -1e19,
                                  "counters": {"accepted": 1e400, "finished": -1e400}})",
                              &s)
                  .ok());
  constexpr int64_t kLimit = int64_t{1} << 53;
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].pid, kLimit);
  EXPECT_EQ(s.workers[0].credit, -kLimit);
  EXPECT_EQ(s.workers[0].last_seen_ms, kLimit);
  EXPECT_EQ(s.queues.at("tiny"), kLimit);
  EXPECT_EQ(s.pending, -kLimit);
  EXPECT_EQ(s.counters.at("accepted"), kLimit);
  EXPECT_EQ(s.counters.at("finished"), -kLimit);
  // The tables and the rates between two such replies are printed without overflow.
  EXPECT_NE(FormatStatus(s, "x").find("accepted 9007199254740992"), std::string::npos);
  FleetStats before = s;
  before.counters["accepted"] = -kLimit;
  EXPECT_FALSE(FormatTop(before, s, 1.0, IntervalMetrics(), "x").empty());
}

TEST(FleetView, StatusTables) {
  FleetStats s;
  ASSERT_TRUE(ParseFleetStats(kStats, &s).ok());
  std::string out = FormatStatus(s, "tcp://b:5555");
  EXPECT_NE(out.find("broker tcp://b:5555: 2 worker(s), 16 job(s) pending"), std::string::npos);
  EXPECT_NE(out.find("WORKER"), std::string::npos);
  EXPECT_NE(out.find("tiny,big"), std::string::npos);
  EXPECT_NE(out.find("1.5s ago"), std::string::npos);
  EXPECT_NE(out.find("250ms ago"), std::string::npos);
  EXPECT_NE(out.find("accepted 100  rejected 2  finished 84"), std::string::npos) << out;
  EXPECT_NE(out.find("poisoned 0"), std::string::npos);  // counters the broker added later
  FleetStats empty;
  out = FormatStatus(empty, "x");
  EXPECT_NE(out.find("no workers connected"), std::string::npos);
}

TEST(FleetView, TopRatesFromCounterDeltasAndMetrics) {
  FleetStats before, after;
  ASSERT_TRUE(ParseFleetStats(kStats, &before).ok());
  after = before;
  after.counters["finished"] += 50;
  after.counters["accepted"] += 20;
  after.queues["tiny"] = 2;

  // Two scrapes of a worker and a broker, 2 s apart.
  namespace n = metrics::names;
  metrics::Registry broker, worker;
  auto* latency = broker.Histogram(n::kJobLatency, "l", n::LatencyBuckets(), {{"model", "tiny"}});
  broker.Gauge(n::kQueueOldestAge, "a", {{"model", "tiny"}})->Set(0.75);
  worker.Gauge(n::kWorkerInfo, "i", {{"worker", "h:1:cuda:0"}, {"device", "cuda:0"}})->Set(1);
  worker.Gauge(n::kExecutors, "e")->Set(2);
  auto* busy = worker.Counter(n::kExecutorBusy, "b", {{"executor", "0"}});
  auto* batches = worker.Counter(n::kBatches, "b", {{"model", "tiny"}});
  for (int i = 0; i < 1000; ++i) latency->Observe(5);  // old history: must not count
  auto scrape = [](const std::string& url, const metrics::Registry& r) {
    Scrape s;
    s.url = url;
    s.ok = metrics::ParseText(r.Expose(), &s.parsed).ok();
    return s;
  };
  std::vector<Scrape> t0 = {scrape("b", broker), scrape("w", worker)};
  for (int i = 0; i < 98; ++i) latency->Observe(0.02);
  for (int i = 0; i < 2; ++i) latency->Observe(0.2);
  busy->Add(1.0);
  batches->Inc(10);
  Scrape dead;
  dead.url = "x";
  dead.error = "unavailable: refused";
  std::vector<Scrape> t1 = {scrape("b", broker), scrape("w", worker), dead};

  IntervalMetrics m = ComputeIntervalMetrics(t0, t1, 2.0);
  EXPECT_GT(m.p50_s, 0.01);
  EXPECT_LE(m.p50_s, 0.025);
  EXPECT_GT(m.p99_s, 0.1);
  EXPECT_LE(m.p99_s, 0.25);
  EXPECT_DOUBLE_EQ(m.busy_percent.at("h:1:cuda:0"), 25.0);  // 1 s of 2 executors x 2 s
  EXPECT_DOUBLE_EQ(m.batches_per_s.at("h:1:cuda:0"), 5.0);
  EXPECT_DOUBLE_EQ(m.oldest_age_s.at("tiny"), 0.75);
  ASSERT_EQ(m.errors.size(), 1u);

  std::string out = FormatTop(before, after, 2.0, m, "tcp://b:5555");
  EXPECT_NE(out.find("finished 25.0/s  accepted 10.0/s"), std::string::npos) << out;
  EXPECT_NE(out.find("p50 1"), std::string::npos) << out;  // 10-25 ms
  EXPECT_NE(out.find("-10"), std::string::npos) << out;    // queue change
  EXPECT_NE(out.find("0.75 s"), std::string::npos) << out;
  EXPECT_NE(out.find("25 "), std::string::npos) << out;  // busy %
  EXPECT_NE(out.find("metrics: x: unavailable"), std::string::npos) << out;
}

TEST(FleetView, JsonReader) {
  JsonValue v;
  ASSERT_TRUE(ParseJson(R"({"a": [1, -2.5e1, true, null, "x\"\u00e9\n"], "b": {}})", &v).ok());
  EXPECT_EQ(v["a"].array.size(), 5u);
  EXPECT_EQ(v["a"].array[1].number, -25);
  EXPECT_EQ(v["a"].array[4].string, "x\"\xc3\xa9\n");
  EXPECT_EQ(v["missing"]["deeper"].type, JsonValue::Type::kNull);
  EXPECT_FALSE(ParseJson("{\"a\": }", &v).ok());
  EXPECT_FALSE(ParseJson("{} x", &v).ok());
}

}  // namespace
}  // namespace ferry::cli
