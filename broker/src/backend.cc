// Worker-facing handlers: READY, DONE, HEARTBEAT, BYE; dropping workers; finishing jobs.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "broker_impl.h"
#include "ferry/protocol/hello_check.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {
namespace {

// The most models a broker knows (announced by workers, or restored from its journal).
constexpr size_t kMaxKnownModels = 4096;

}  // namespace

void Broker::Impl::LimitedWarn(LogLimiter& limiter, const std::string& text) {
  int64_t suppressed = 0;
  if (!limiter.Allow(protocol::MonotonicMicros(), &suppressed)) return;
  if (suppressed > 0)
    spdlog::warn("{} ({} similar warning(s) suppressed)", text, suppressed);
  else
    spdlog::warn("{}", text);
}

void Broker::Impl::HandleBackend(protocol::Message& m) {
  if (!WorkerAllowed(m)) {
    LimitedWarn(refused_log, "dropped a worker message from a key that is no longer allowed");
    return;
  }
  const std::string worker(m.envelope[0].to_string_view());
  msgpack::object_handle oh;
  Status s = protocol::UnpackMap(m.body.data(), m.body.size(), &oh);
  if (s.ok() && !m.frames.empty())
    s = Status(codes::kMalformed, "a worker message carries no data frames");
  if (!s.ok()) {
    telemetry.OnRefusedMessage();
    LimitedWarn(bad_worker_message_log, "worker message " + m.command +
                                            " undecodable: " + protocol::Printable(s.message()));
    return;
  }
  if (m.command == protocol::kReady) {
    HandleReady(m, oh.get());
    return;
  }
  if (!scheduler.HasWorker(worker)) {
    // Unknown (we restarted, or dropped it as silent): ask it to announce itself. Its DONEs
    // count only for jobs whose result is in Redis (HandleDone).
    if (m.command != protocol::kBye)
      protocol::SendMessage(backend, &m.envelope, protocol::kReannounce, protocol::EncodeEmpty());
    if (m.command != protocol::kDone) return;
  }
  scheduler.Touch(worker, protocol::MonotonicMicros());
  if (m.command == protocol::kDone) {
    HandleDone(m, oh.get());
  } else if (m.command == protocol::kBye) {
    // A worker says BYE once it wrote the results of every job it received: what it still holds
    // here never reached it (a CHUNK that crossed its last DONE) and goes back without spending
    // an attempt.
    DropWorker(worker, "said BYE", /*spend_attempt=*/false);
  } else if (m.command != protocol::kHeartbeat) {
    telemetry.OnRefusedMessage();
    LimitedWarn(bad_worker_message_log, "unknown worker command " + protocol::Printable(m.command));
  }
}

void Broker::Impl::HandleReady(protocol::Message& m, const msgpack::object& body) {
  const std::string worker(m.envelope[0].to_string_view());
  protocol::WorkerHello hello;
  Status s = protocol::DecodeHello(body, &hello);
  if (s.ok()) s = protocol::CheckHello(hello);
  if (s.ok() && hello.redis_prefix && *hello.redis_prefix != keys.prefix())
    s = Status::InvalidArgument("READY says --redis-prefix \"" +
                                protocol::Printable(*hello.redis_prefix, 100) +
                                "\", the broker's is \"" + protocol::Printable(keys.prefix(), 100) +
                                "\": its results would go where no producer reads them");
  if (s.ok()) {
    // Every model ever announced is kept (its queue, input specs, metric series, journal set):
    // a worker announcing new names at each READY would grow them without end.
    size_t fresh = 0;
    for (const auto& mi : hello.models) fresh += scheduler.KnowsModel(mi.name) ? 0 : 1;
    if (fresh > 0 && scheduler.known_models().size() + fresh > kMaxKnownModels)
      s = Status::InvalidArgument("READY announces " + std::to_string(fresh) +
                                  " model(s) new to the broker, which knows " +
                                  std::to_string(scheduler.known_models().size()) +
                                  " already: at most " + std::to_string(kMaxKnownModels));
  }
  if (s.ok()) {
    // A worker name is unique: the same name on a new connection is that worker reconnected,
    // and the old connection is dead -- unless, with CURVE, the new connection has another key:
    // then it is someone else claiming the name.
    for (const auto& [rid_w, w] : scheduler.workers()) {
      if (rid_w != worker && w.hello.worker == hello.worker && zap && w.key != m.user_id) {
        s = Status::InvalidArgument("worker name \"" + hello.worker +
                                    "\" is in use by a connection with another key");
        break;
      }
    }
  }
  if (!s.ok()) {
    telemetry.OnRefusedMessage();
    LimitedWarn(bad_worker_message_log,
                "refused a READY: " + protocol::Printable(s.message(), 300));
    protocol::SendMessage(backend, &m.envelope, protocol::kError,
                          protocol::EncodeError(0, s.code(), s.message()));
    return;
  }
  const bool known = scheduler.HasWorker(worker);
  std::vector<std::string> stale;  // dropped below, once the jobs this READY holds moved here
  for (const auto& [rid_w, w] : scheduler.workers())
    if (rid_w != worker && w.hello.worker == hello.worker) stale.push_back(rid_w);
  std::string models;
  for (const auto& mi : hello.models) {
    models += (models.empty() ? "" : ",") + mi.name;
    // Every announcement renews the set's week (protocol.md: "one week after the last").
    if (options.journal) journal.NoteModel(mi.name);
  }
  spdlog::info("worker {} {} on {} (capacity {}, models {}{})", hello.worker,
               known ? "re-announced" : "joined", hello.device, hello.capacity, models,
               zap ? ", key " + zap->NameOf(m.user_id) : "");
  std::vector<std::string> declared;  // models whose input specs this worker announces
  for (const auto& mi : hello.models)
    if (mi.inputs) declared.push_back(mi.name);
  const std::string name = hello.worker;
  const std::vector<std::string> held = std::move(hello.held);
  hello.held.clear();
  scheduler.AddWorker(worker, std::move(hello), protocol::MonotonicMicros(), m.user_id);
  // A HEARTBEAT at once says the broker's interval: a worker heartbeating faster would
  // otherwise presume it dead before the first of the broker's own came.
  protocol::SendTo(backend, worker, protocol::kHeartbeat,
                   protocol::EncodeHeartbeat(options.heartbeat_ms));
  // A worker back after a broker restart, after it was dropped as silent, or on a new
  // connection keeps the jobs it still runs: they are not sent elsewhere, not expired while it
  // runs them, and not requeued (an attempt spent) with its old connection.
  if (!held.empty()) {
    std::vector<const Job*> were_waiting;
    const size_t claimed = scheduler.Claim(worker, held, &were_waiting);
    telemetry.OnClaimed(were_waiting);
    if (claimed > 0 || !known)
      spdlog::info("worker {} still holds {} job(s); {} of them stay with it", name, held.size(),
                   claimed);
  }
  for (const auto& id : stale) DropWorker(id, "replaced by a new connection");
  for (const auto& model : declared) {
    const auto* specs = scheduler.SpecsOf(model);
    if (specs != nullptr && specs->size() > 1)
      spdlog::warn(
          "model {}: workers announce {} different input specs (worker {} is the latest); jobs "
          "matching any of them are accepted",
          model, specs->size(), name);
  }
}

void Broker::Impl::HandleDone(protocol::Message& m, const msgpack::object& body) {
  const std::string worker(m.envelope[0].to_string_view());
  std::vector<std::string> ids;
  Status s = protocol::GetStringArray(body, "ids", &ids);
  int64_t duplicates = 0;
  if (s.ok()) s = protocol::GetInt(body, "duplicates", &duplicates, 0);
  protocol::DoneStatuses not_done;
  if (s.ok()) s = protocol::DecodeDoneStatuses(body, &not_done);
  protocol::InlineResults results;  // views into m.body, alive until Finish returns
  if (s.ok()) s = protocol::DecodeInlineResults(body, &results);
  std::vector<std::string> notified;  // their producers already have the notice
  if (s.ok()) s = protocol::DecodeDoneNotified(body, &notified);
  if (!s.ok()) {
    telemetry.OnRefusedMessage();
    LimitedWarn(bad_worker_message_log,
                "bad DONE from a worker: " + protocol::Printable(s.message()));
    return;
  }
  // A duplicate is one of the ids reported: a bigger claim (a worker that lies, 2^63-1 twice)
  // must not wrap the counters. Logged at most 10 times per 10 s, as the warnings.
  duplicates = std::clamp<int64_t>(duplicates, 0, static_cast<int64_t>(ids.size()));
  if (duplicates > 0) {
    scheduler.mutable_counters().duplicates += duplicates;
    int64_t suppressed = 0;
    if (duplicates_log.Allow(protocol::MonotonicMicros(), &suppressed))
      spdlog::info("{} duplicate result(s) suppressed (an earlier result of the job won){}",
                   duplicates,
                   suppressed > 0 ? " (" + std::to_string(suppressed) + " such lines suppressed)"
                                  : std::string());
  }
  const msgpack::object* bye = protocol::Find(body, "bye");
  const bool leaving = bye != nullptr && bye->type == msgpack::type::BOOLEAN && bye->via.boolean;
  // A draining worker's DONE: it gets no more work, before this turn's dispatch could spend the
  // credit these jobs return. Its report may come in several DONEs (at most 4,096 ids each).
  if (leaving) scheduler.MarkLeaving(worker);
  // Only the jobs this connection holds are finished on its word (and only their inline records
  // are forwarded); the others once their result is seen in Redis.
  std::vector<std::string> not_held;
  auto finished = scheduler.Complete(worker, ids, &not_held);
  telemetry.OnDone(finished, not_done, duplicates, protocol::NowMicros());
  Finish(std::move(finished), results, notified);
  if (!not_held.empty()) FinishIfStored(not_held, worker, not_done, notified);
  // Once it holds nothing, it goes. (Else its BYE, which follows, or its silence removes it and
  // requeues what it still held. Its BYE then finds it gone.)
  if (leaving) {
    auto w = scheduler.workers().find(worker);
    if (w != scheduler.workers().end() && w->second.in_flight.empty())
      DropWorker(worker, "said bye with its last DONE");
  }
}

void Broker::Impl::FinishIfStored(const std::vector<std::string>& ids, const std::string& from,
                                  const protocol::DoneStatuses& not_done,
                                  const std::vector<std::string>& notified) {
  constexpr size_t kMaxChecks = 4096;  // per DONE: a claim about more is cut there
  std::vector<std::string_view> checked;
  for (const auto& id : ids) {
    if (checked.size() == kMaxChecks) break;
    const std::string key = keys.Result(id);
    redis->Append({"EXISTS", key});
    checked.push_back(id);
  }
  std::vector<protocol::RedisReply> replies;
  Status s = redis->Flush(&replies);
  if (!s.ok() || replies.size() != checked.size()) {
    LimitedWarn(bad_worker_message_log, "a DONE names " + std::to_string(ids.size()) +
                                            " job(s) its sender does not hold; Redis could not "
                                            "say whether their results exist: " +
                                            s.message());
    return;
  }
  std::vector<std::unique_ptr<Job>> stored;
  size_t refused = 0;
  for (size_t i = 0; i < checked.size(); ++i) {
    if (replies[i].type == protocol::RedisReply::Type::kInteger && replies[i].integer == 1) {
      if (auto job = scheduler.Take(std::string(checked[i]))) stored.push_back(std::move(job));
    } else {
      ++refused;
    }
  }
  if (!stored.empty()) {
    scheduler.mutable_counters().finished += static_cast<int64_t>(stored.size());
    telemetry.OnDone(stored, not_done, 0, protocol::NowMicros());
    Finish(std::move(stored), {}, notified);
  }
  if (refused > 0) {
    telemetry.OnRefusedMessage();
    const auto w = scheduler.workers().find(from);
    LimitedWarn(bad_worker_message_log,
                "ignored a DONE for " + std::to_string(refused) + " job(s) that " +
                    (w == scheduler.workers().end() ? std::string("an unregistered connection")
                                                    : "worker " + w->second.hello.worker) +
                    " does not hold and whose result is not in Redis");
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
  // Accepted in this turn (only the broker's own results end such a job: a worker's DONE is
  // read after the commit): the FINISHED goes after the ACCEPTED (CommitAndReply).
  if (first_unreplied_seq != INT64_MAX) {
    auto held = std::stable_partition(
        jobs.begin(), jobs.end(), [this](const auto& j) { return j->seq < first_unreplied_seq; });
    for (auto it = held; it != jobs.end(); ++it) held_finished.push_back(std::move(*it));
    jobs.erase(held, jobs.end());
  }
  NotifyFinished(jobs, results, notified);
}

void Broker::Impl::DropWorker(const std::string& routing_id, const char* why, bool spend_attempt) {
  auto it = scheduler.workers().find(routing_id);
  const std::string name = it != scheduler.workers().end() ? it->second.hello.worker : "?";
  // Back in their queues, attempt + 1 (unless the worker never got them).
  auto held = scheduler.RemoveWorker(routing_id, spend_attempt);
  // Those over --max-attempts are poisoned below instead: counted as poisoned, not requeued.
  std::vector<Job*> requeued, poisoned;
  for (Job* job : held) (job->attempt <= options.max_attempts ? requeued : poisoned).push_back(job);
  scheduler.mutable_counters().requeued += static_cast<int64_t>(requeued.size());
  if (held.empty())
    spdlog::info("worker {} removed ({})", name, why);
  else
    spdlog::warn("worker {} removed ({}); {} job(s) requeued, {} poisoned", name, why,
                 requeued.size(), poisoned.size());
  telemetry.OnRequeued(requeued);
  if (options.journal)
    for (Job* job : requeued) journal.Restage(job->id);  // its attempt, for a restarted broker
  for (Job* job : poisoned) {
    std::string message = "the workers running this job died " + std::to_string(job->attempt - 1) +
                          " times; giving up after " + std::to_string(options.max_attempts) +
                          " attempts";
    spdlog::warn("job {} poisoned: {}", job->id, message);
    ++scheduler.mutable_counters().poisoned;
    const std::string id = job->id;
    auto taken = scheduler.Take(id);
    taken->attempt -= 1;  // the attempts actually made
    final_results.Add(std::move(taken), "failed", codes::kPoisoned, std::move(message));
  }
}

}  // namespace ferry::broker
