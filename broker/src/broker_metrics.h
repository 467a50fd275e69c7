#pragma once
// BrokerMetrics: the broker's Prometheus series (metrics/include/ferry/metrics/names.h;
// docs/operations.md lists them) and the hooks the event loop calls to keep them.
//
// Counters and histograms move in the hooks, on the broker thread, through pointers looked up
// once per model (a hash lookup by the model name per job or chunk; no string is built). Gauges
// that describe the scheduler's state -- queue depth and oldest age per model, pending jobs,
// workers with their credit and in-flight -- are refreshed by Refresh(), which the loop calls
// every turn and which does the work at most every 100 ms. The HTTP thread only reads the
// registry (and Healthy(), an atomic), so the scheduler needs no lock.
//
// Thread-safety: everything but Healthy() on the broker thread.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/metrics/registry.h"
#include "ferry/protocol/messages.h"
#include "job.h"
#include "scheduler.h"

namespace ferry::broker {

class BrokerMetrics {
 public:
  // `registry` must outlive this object.
  explicit BrokerMetrics(metrics::Registry* registry);
  BrokerMetrics(const BrokerMetrics&) = delete;
  BrokerMetrics& operator=(const BrokerMetrics&) = delete;

  // A SUBMIT is answered: its accepted jobs (`models[i]` is the model of `reply.ids[i]`) and
  // its rejections by code.
  void OnReply(const protocol::Accepted& reply, const std::vector<std::string>& models);
  // A chunk goes to a worker: dispatched jobs, chunks, queue time of first dispatches.
  void OnChunk(const Chunk& chunk, int64_t now_us);
  // Queued or parked jobs a worker said it holds (READY "held", Scheduler::Claim): dispatched
  // to it without a chunk (their queue time is not observed: they went out before).
  void OnClaimed(const std::vector<const Job*>& jobs);
  // A worker reported these jobs finished (DONE); `not_done` gives the non-"done" statuses.
  void OnDone(const std::vector<std::unique_ptr<Job>>& jobs, const protocol::DoneStatuses& not_done,
              int64_t duplicates, int64_t now_us);
  // A result the broker wrote itself is in Redis (FinalResults): status "expired", "cancelled",
  // "failed" or "poisoned".
  void OnBrokerFinished(const Job& job, std::string_view status);
  // Jobs requeued after their worker was lost.
  void OnRequeued(const std::vector<Job*>& jobs);
  // A message dropped unread (see names.h kMessagesRefused); a reply that could not be sent.
  void OnRefusedMessage() { refused_->Inc(); }
  void OnReplyDropped() { replies_dropped_->Inc(); }
  // Inline results left out of FINISHED (reply_backlog.h).
  void OnInlineResultsWithheld(int64_t n) { inline_withheld_->Inc(static_cast<uint64_t>(n)); }

  // Refreshes the gauges from the scheduler, at most every 100 ms (always with `force`).
  void Refresh(const Scheduler& scheduler, int64_t now_mono_us, bool force = false);

  // For /healthz (any thread): false, with *why, when the loop has not turned for 10 s.
  bool Healthy(std::string* why) const;

 private:
  enum StatusIndex { kDone, kFailed, kCancelled, kExpired, kPoisoned, kStatusCount };
  struct ModelSeries {
    metrics::Counter* accepted;
    metrics::Counter* dispatched;
    metrics::Counter* requeued;
    metrics::Counter* finished[kStatusCount];
    metrics::Histogram* latency;
    metrics::Histogram* queue_time;
    metrics::Gauge* depth;
    metrics::Gauge* oldest_age;
    metrics::Gauge* workers;  // ferry_model_workers
  };
  ModelSeries* Model(const std::string& name);
  metrics::Counter* Rejected(std::string_view code);
  void RefreshWorkers(const Scheduler& scheduler);

  metrics::Registry* registry_;
  std::unordered_map<std::string, std::unique_ptr<ModelSeries>> models_;
  std::map<std::string, metrics::Counter*, std::less<>> rejected_;
  std::set<std::string> exposed_workers_;  // names with credit/in-flight series
  metrics::Counter* chunks_;
  metrics::Counter* duplicates_;
  metrics::Counter* refused_;
  metrics::Counter* replies_dropped_;
  metrics::Counter* inline_withheld_;
  metrics::Gauge* pending_;
  metrics::Gauge* workers_connected_;
  int64_t next_refresh_us_ = 0;
  std::atomic<int64_t> last_turn_us_{0};  // monotonic; read by Healthy()
};

}  // namespace ferry::broker
