#include "orphan_watch.h"

#include <spdlog/spdlog.h>

#include <ctime>
#include <set>

#include "broker_impl.h"
#include "ferry/protocol/util.h"
#include "ferry/runtime/logging.h"

namespace ferry::broker {

std::string FormatUtc(int64_t wall_us) {
  const std::time_t t = static_cast<std::time_t>(wall_us / 1000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<OrphanWatch::Expired> OrphanWatch::Check(const Scheduler& scheduler, int64_t now_us) {
  std::vector<Expired> out;
  if (now_us < next_check_us_) return out;
  next_check_us_ = now_us + 1000000;
  std::set<std::string> served;
  for (const auto& [rid, w] : scheduler.workers())
    for (const auto& m : w.hello.models) served.insert(m.name);
  std::set<std::string> models = scheduler.known_models();
  for (const auto& [model, depth] : scheduler.QueueDepths()) models.insert(model);
  for (const auto& model : models) {
    auto it = orphaned_.find(model);
    if (served.count(model) != 0) {
      if (it != orphaned_.end()) {
        spdlog::info("model {} has a worker again (none since {})", model, FormatUtc(it->second));
        orphaned_.erase(it);
      }
      continue;
    }
    // Parked jobs (restored after a restart, for the liveness period) wait too, but not for any
    // worker: the one that ran them claims them, or they expire. The timeout leaves them be.
    const size_t parked = scheduler.ParkedOf(model);
    const size_t queued = scheduler.QueueDepth(model) - parked;
    if (it == orphaned_.end()) {
      // A model that no worker served since this broker started (restored from the journal)
      // counts from the start; one that just lost its last worker, from now.
      const int64_t since = first_ ? start_us_ : now_us;
      it = orphaned_.emplace(model, since).first;
      const std::string also_parked =
          parked == 0 ? ""
                      : "; " + std::to_string(parked) +
                            " parked job(s) expire unless the worker that ran them claims them";
      if (timeout_us_ > 0)
        spdlog::warn(
            "model {} has no worker (since {}); its {} queued job(s), and new ones, fail "
            "unavailable after {} s without one (--orphan-timeout-s){}",
            model, FormatUtc(since), queued, timeout_us_ / 1000000, also_parked);
      else
        spdlog::warn("model {} has no worker (since {}); its {} queued job(s) wait for one{}",
                     model, FormatUtc(since), queued, also_parked);
    }
    if (timeout_us_ > 0 && now_us - it->second >= timeout_us_ && queued > 0)
      out.push_back({model, "no worker for model " + model + " since " + FormatUtc(it->second) +
                                " (--orphan-timeout-s " + std::to_string(timeout_us_ / 1000000) +
                                ")"});
  }
  first_ = false;
  return out;
}

void Broker::Impl::FailOrphans() {
  for (const auto& e : orphans.Check(scheduler, protocol::NowMicros())) {
    auto jobs = scheduler.TakeQueued(e.model);
    if (jobs.empty()) continue;
    {
      logging::LogFields fields({{"model", e.model}, {"job_id", jobs.front()->id}});
      spdlog::warn("{} queued job(s) of model {} failed unavailable: {} (first: {})", jobs.size(),
                   e.model, e.message, jobs.front()->id);
    }
    for (auto& job : jobs)
      final_results.Add(std::move(job), "failed", codes::kUnavailable, e.message);
  }
}

}  // namespace ferry::broker
