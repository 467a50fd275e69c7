#include "broker_metrics.h"

#include <spdlog/spdlog.h>

#include <string_view>
#include <unordered_map>

#include "broker_impl.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/names.h"
#include "ferry/metrics/redis_probe.h"
#include "ferry/protocol/util.h"
#include "ferry/status.h"

#ifndef FERRY_VERSION
#define FERRY_VERSION "unknown"
#endif

namespace ferry::broker {
namespace names = metrics::names;

namespace {
constexpr int64_t kRefreshEveryUs = 100 * 1000;
constexpr int64_t kStalledAfterUs = 10 * 1000 * 1000;
constexpr const char* kStatusNames[] = {"done", "failed", "cancelled", "expired", "poisoned"};
// Codes SUBMIT can reject a job with, exposed at 0 from the start. (A SUBMIT refused as a whole,
// an ERROR, counts in ferry_broker_messages_refused_total.)
constexpr const char* kRejectCodes[] = {codes::kInvalidArgument, codes::kUnknownModel,
                                        codes::kDuplicate,       codes::kTooLarge,
                                        codes::kQueueFull,       codes::kUnavailable};

double Seconds(int64_t us) { return us > 0 ? static_cast<double>(us) / 1e6 : 0.0; }
}  // namespace

BrokerMetrics::BrokerMetrics(metrics::Registry* registry) : registry_(registry) {
  chunks_ = registry_->Counter(names::kChunksDispatched, names::kChunksDispatchedHelp);
  duplicates_ = registry_->Counter(names::kDuplicatesSuppressed, names::kDuplicatesSuppressedHelp);
  refused_ = registry_->Counter(names::kMessagesRefused, names::kMessagesRefusedHelp);
  replies_dropped_ = registry_->Counter(names::kRepliesDropped, names::kRepliesDroppedHelp);
  inline_withheld_ =
      registry_->Counter(names::kInlineResultsWithheld, names::kInlineResultsWithheldHelp);
  pending_ = registry_->Gauge(names::kJobsPending, names::kJobsPendingHelp);
  workers_connected_ = registry_->Gauge(names::kWorkersConnected, names::kWorkersConnectedHelp);
  for (const char* code : kRejectCodes) Rejected(code);
  last_turn_us_.store(protocol::MonotonicMicros());
}

BrokerMetrics::ModelSeries* BrokerMetrics::Model(const std::string& name) {
  auto it = models_.find(name);
  if (it != models_.end()) return it->second.get();
  auto m = std::make_unique<ModelSeries>();
  const metrics::Labels model = {{names::kLabelModel, name}};
  m->accepted = registry_->Counter(names::kJobsAccepted, names::kJobsAcceptedHelp, model);
  m->dispatched = registry_->Counter(names::kJobsDispatched, names::kJobsDispatchedHelp, model);
  m->requeued = registry_->Counter(names::kJobsRequeued, names::kJobsRequeuedHelp, model);
  for (int s = 0; s < kStatusCount; ++s) {
    m->finished[s] =
        registry_->Counter(names::kJobsFinished, names::kJobsFinishedHelp,
                           {{names::kLabelModel, name}, {names::kLabelStatus, kStatusNames[s]}});
  }
  m->latency = registry_->Histogram(names::kJobLatency, names::kJobLatencyHelp,
                                    names::LatencyBuckets(), model);
  m->queue_time = registry_->Histogram(names::kJobQueueTime, names::kJobQueueTimeHelp,
                                       names::LatencyBuckets(), model);
  m->depth = registry_->Gauge(names::kQueueDepth, names::kQueueDepthHelp, model);
  m->oldest_age = registry_->Gauge(names::kQueueOldestAge, names::kQueueOldestAgeHelp, model);
  m->workers = registry_->Gauge(names::kModelWorkers, names::kModelWorkersHelp, model);
  return models_.emplace(name, std::move(m)).first->second.get();
}

metrics::Counter* BrokerMetrics::Rejected(std::string_view code) {
  auto it = rejected_.find(code);
  if (it != rejected_.end()) return it->second;
  metrics::Counter* c = registry_->Counter(names::kJobsRejected, names::kJobsRejectedHelp,
                                           {{names::kLabelCode, std::string(code)}});
  rejected_.emplace(std::string(code), c);
  return c;
}

void BrokerMetrics::OnReply(const protocol::Accepted& reply,
                            const std::vector<std::string>& models) {
  ModelSeries* m = nullptr;
  const std::string* model = nullptr;  // a SUBMIT's jobs are mostly of one model: few lookups
  for (const auto& name : models) {
    if (model == nullptr || name != *model) {
      m = Model(name);
      model = &name;
    }
    m->accepted->Inc();
  }
  for (const auto& r : reply.rejected) Rejected(r.code)->Inc();
}

void BrokerMetrics::OnChunk(const Chunk& chunk, int64_t now_us) {
  if (chunk.jobs.empty()) return;
  chunks_->Inc();
  ModelSeries* m = nullptr;
  const std::string* model = nullptr;  // a chunk is of one model: one lookup
  for (const Job* j : chunk.jobs) {
    if (model == nullptr || j->model != *model) {
      m = Model(j->model);
      model = &j->model;
    }
    m->dispatched->Inc();
    if (j->attempt == 1) m->queue_time->Observe(Seconds(now_us - j->submitted_us));
  }
}

void BrokerMetrics::OnClaimed(const std::vector<const Job*>& jobs) {
  for (const Job* j : jobs) Model(j->model)->dispatched->Inc();
}

void BrokerMetrics::OnDone(const std::vector<std::unique_ptr<Job>>& jobs,
                           const protocol::DoneStatuses& not_done, int64_t duplicates,
                           int64_t now_us) {
  if (duplicates > 0) duplicates_->Inc(static_cast<uint64_t>(duplicates));
  // The jobs that did not succeed, by id (a DONE may name 4,096 of them: no scan per job).
  std::unordered_map<std::string_view, int> failed;
  for (const auto& [id, st] : not_done)
    failed.emplace(id, st == kStatusNames[kCancelled] ? kCancelled
                       : st == kStatusNames[kExpired] ? kExpired
                                                      : kFailed);
  ModelSeries* m = nullptr;
  const std::string* model = nullptr;
  for (const auto& j : jobs) {
    if (model == nullptr || j->model != *model) {
      m = Model(j->model);
      model = &j->model;
    }
    const auto it = failed.find(j->id);
    m->finished[it == failed.end() ? kDone : it->second]->Inc();
    m->latency->Observe(Seconds(now_us - j->submitted_us));
  }
}

void BrokerMetrics::OnBrokerFinished(const Job& job, std::string_view status) {
  int s = kFailed;
  for (int i = 0; i < kStatusCount; ++i)
    if (status == kStatusNames[i]) s = i;
  Model(job.model)->finished[s]->Inc();
}

void BrokerMetrics::OnRequeued(const std::vector<Job*>& jobs) {
  for (const Job* j : jobs) {
    Model(j->model)->requeued->Inc();
  }
}

void BrokerMetrics::Refresh(const Scheduler& scheduler, int64_t now_mono_us, bool force) {
  last_turn_us_.store(now_mono_us, std::memory_order_relaxed);
  if (!force && now_mono_us < next_refresh_us_) return;
  next_refresh_us_ = now_mono_us + kRefreshEveryUs;
  const int64_t now_us = protocol::NowMicros();
  for (const auto& name : scheduler.known_models()) Model(name);  // known models show 0
  std::unordered_map<std::string, int> serving;
  for (const auto& [routing_id, w] : scheduler.workers())
    for (const auto& mi : w.hello.models) ++serving[mi.name];
  for (auto& [name, m] : models_) {
    auto n = serving.find(name);
    m->workers->Set(n == serving.end() ? 0.0 : static_cast<double>(n->second));
    m->depth->Set(static_cast<double>(scheduler.QueueDepth(name)));
    const int64_t oldest = scheduler.OldestQueuedSubmittedUs(name);
    m->oldest_age->Set(oldest == 0 ? 0.0 : Seconds(now_us - oldest));
  }
  pending_->Set(static_cast<double>(scheduler.pending()));
  RefreshWorkers(scheduler);
}

void BrokerMetrics::RefreshWorkers(const Scheduler& scheduler) {
  // Looked up by name every refresh (not cached): a worker's series go away when it leaves,
  // and a name can move to a new connection.
  workers_connected_->Set(static_cast<double>(scheduler.workers().size()));
  std::set<std::string> live;
  for (const auto& [routing_id, w] : scheduler.workers()) {
    const metrics::Labels labels = {{names::kLabelWorker, w.hello.worker}};
    live.insert(w.hello.worker);
    registry_->Gauge(names::kWorkerCredit, names::kWorkerCreditHelp, labels)
        ->Set(static_cast<double>(w.credit()));
    registry_->Gauge(names::kWorkerInFlight, names::kWorkerInFlightHelp, labels)
        ->Set(static_cast<double>(w.in_flight.size()));
  }
  for (const auto& name : exposed_workers_) {
    if (live.count(name) != 0) continue;
    registry_->Remove(names::kWorkerCredit, {{names::kLabelWorker, name}});
    registry_->Remove(names::kWorkerInFlight, {{names::kLabelWorker, name}});
  }
  exposed_workers_ = std::move(live);
}

bool BrokerMetrics::Healthy(std::string* why) const {
  const int64_t idle = protocol::MonotonicMicros() - last_turn_us_.load(std::memory_order_relaxed);
  if (idle <= kStalledAfterUs) return true;
  *why = "event loop stalled for " + std::to_string(idle / 1000) + " ms";
  return false;
}

}  // namespace ferry::broker

// ---- the HTTP endpoint -------------------------------------------------------------------------
namespace ferry::broker {

Status Broker::Impl::StartMetricsServer() {
  names::RegisterProcessInfo(&metrics_registry, "broker", FERRY_VERSION);
  telemetry.Refresh(scheduler, protocol::MonotonicMicros(), /*force=*/true);
  if (options.metrics_port == 0) return Status::Ok();
  metrics::MetricsServerOptions mo;
  mo.port = options.metrics_port < 0 ? metrics::kAnyPort : options.metrics_port;
  mo.bind_address = options.metrics_addr;
  BrokerMetrics* t = &telemetry;
  mo.health = [t](std::string* why) { return t->Healthy(why); };
  // /healthz and /readyz: Redis answers (a probe thread with its own connection, which also
  // reads INFO memory for ferry_redis_used_memory_bytes); the sockets are bound by now.
  metrics::RedisProbe::Options po;
  FERRY_RETURN_IF_ERROR(
      protocol::ResolveRedisEndpoint(options.redis, options.redis_files, &po.endpoint));
  po.timeout_ms = static_cast<int>(options.redis_timeout_ms);
  po.memory = true;
  redis_probe = std::make_unique<metrics::RedisProbe>(&metrics_registry, std::move(po));
  metrics::RedisProbe* probe = redis_probe.get();
  mo.depends = [probe](std::string* why) { return probe->Up(why); };
  metrics::Registry* registry = &metrics_registry;
  mo.before_scrape = [registry] { names::SampleProcessMetrics(registry); };
  Status s = metrics::MetricsServer::Start(&metrics_registry, mo, &metrics_server);
  if (!s.ok())
    return Status(s.code(), "--metrics-addr " + options.metrics_addr + " --metrics-port " +
                                std::to_string(options.metrics_port) + ": " + s.message());
  spdlog::info("metrics on http://{}:{}/metrics", options.metrics_addr, metrics_server->port());
  return Status::Ok();
}

}  // namespace ferry::broker
