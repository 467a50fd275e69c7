// Worker-facing handlers: READY, DONE, HEARTBEAT, BYE; dropping workers; finishing jobs.
#include <spdlog/spdlog.h>

#include "broker_impl.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {

void Broker::Impl::HandleBackend(protocol::Message& m) {
  const std::string worker(m.envelope[0].to_string_view());
  const int64_t now_mono = protocol::MonotonicMicros();
  msgpack::object_handle oh;
  Status s = protocol::UnpackMap(m.body.data(), m.body.size(), &oh);
  if (!s.ok()) {
    spdlog::warn("worker message {} undecodable: {}", m.command, s.message());
    return;
  }
  if (m.command == protocol::kReady) {
    protocol::WorkerHello hello;
    s = protocol::DecodeHello(oh.get(), &hello);
    if (!s.ok()) {
      spdlog::warn("bad READY: {}", s.message());
      protocol::SendMessage(backend, &m.envelope, protocol::kError,
                            protocol::EncodeError(0, s.code(), s.message()));
      return;
    }
    const bool known = scheduler.HasWorker(worker);
    // A worker name is unique: the same name on a new connection is that worker reconnected,
    // and the old connection is dead.
    std::vector<std::string> stale;
    for (const auto& [rid_w, w] : scheduler.workers())
      if (rid_w != worker && w.hello.worker == hello.worker) stale.push_back(rid_w);
    for (const auto& id : stale) DropWorker(id, "replaced by a new connection");
    std::string models;
    for (const auto& mi : hello.models) {
      models += (models.empty() ? "" : ",") + mi.name;
      if (options.journal && !scheduler.KnowsModel(mi.name)) journal.NoteModel(mi.name);
    }
    spdlog::info("worker {} {} on {} (capacity {}, models {})", hello.worker,
                 known ? "re-announced" : "joined", hello.device, hello.capacity, models);
    scheduler.AddWorker(worker, std::move(hello), now_mono);
    return;
  }
  if (!scheduler.HasWorker(worker)) {
    // Unknown (we restarted, or dropped it as silent): ask it to announce itself. Its DONEs
    // still count -- the results are in Redis whoever wrote them.
    if (m.command != protocol::kBye)
      protocol::SendMessage(backend, &m.envelope, protocol::kReannounce, protocol::EncodeEmpty());
    if (m.command != protocol::kDone) return;
  }
  scheduler.Touch(worker, now_mono);
  if (m.command == protocol::kDone) {
    std::vector<std::string> ids;
    s = protocol::GetStringArray(oh.get(), "ids", &ids);
    int64_t duplicates = 0;
    if (s.ok()) s = protocol::GetInt(oh.get(), "duplicates", &duplicates, 0);
    protocol::DoneStatuses not_done;
    if (s.ok()) s = protocol::DecodeDoneStatuses(oh.get(), &not_done);
    protocol::InlineResults results;  // views into m.body, alive until Finish returns
    if (s.ok()) s = protocol::DecodeInlineResults(oh.get(), &results);
    std::vector<std::string> notified;  // their producers already have the notice
    if (s.ok()) s = protocol::DecodeDoneNotified(oh.get(), &notified);
    if (!s.ok()) {
      spdlog::warn("bad DONE from worker: {}", s.message());
      return;
    }
    if (duplicates > 0) {
      scheduler.mutable_counters().duplicates += duplicates;
      spdlog::info("{} duplicate result(s) suppressed (an earlier result of the job won)",
                   duplicates);
    }
    const msgpack::object* bye = protocol::Find(oh.get(), "bye");
    auto finished = scheduler.Complete(worker, ids);
    telemetry.OnDone(finished, not_done, duplicates, protocol::NowMicros());
    Finish(std::move(finished), results, notified);
    // A draining worker's last DONE: remove it now, before this turn's dispatch could spend the
    // credit those jobs returned. (Its BYE, which follows, then finds it gone.)
    if (bye != nullptr && bye->type == msgpack::type::BOOLEAN && bye->via.boolean &&
        scheduler.HasWorker(worker))
      DropWorker(worker, "said bye with its last DONE");
  } else if (m.command == protocol::kBye) {
    DropWorker(worker, "said BYE");
  } else if (m.command != protocol::kHeartbeat) {
    spdlog::warn("unknown worker command {}", m.command);
  }
}

void Broker::Impl::Finish(std::vector<std::unique_ptr<Job>> jobs,
                          const protocol::InlineResults& results,
                          const std::vector<std::string>& notified) {
  if (jobs.empty()) return;
  if (options.journal) {
    const int64_t now_mono = protocol::MonotonicMicros();
    for (const auto& j : jobs) journal.Forget(j->id, now_mono);
  }
  NotifyFinished(jobs, results, notified);
}

void Broker::Impl::DropWorker(const std::string& routing_id, const char* why) {
  auto it = scheduler.workers().find(routing_id);
  const std::string name = it != scheduler.workers().end() ? it->second.hello.worker : "?";
  auto requeued = scheduler.RemoveWorker(routing_id);
  if (requeued.empty())
    spdlog::info("worker {} removed ({})", name, why);
  else
    spdlog::warn("worker {} removed ({}); {} job(s) requeued", name, why, requeued.size());
  telemetry.OnRequeued(requeued);
  for (Job* job : requeued) {
    if (job->attempt <= options.max_attempts) continue;
    std::string message = "the workers running this job died " + std::to_string(job->attempt - 1) +
                          " times; giving up after " + std::to_string(options.max_attempts) +
                          " attempts";
    spdlog::warn("job {} poisoned: {}", job->id, message);
    ++scheduler.mutable_counters().poisoned;
    telemetry.OnBrokerFinished(*job, codes::kPoisoned);
    const std::string id = job->id;
    auto taken = scheduler.Take(id);
    taken->attempt -= 1;  // the attempts actually made
    final_results.Add(std::move(taken), "failed", codes::kPoisoned, std::move(message));
  }
}

}  // namespace ferry::broker
