// The broker's loop: poll both sockets, handle what arrived, commit the journal and reply,
// dispatch, write the broker's own results, heartbeat. See broker_impl.h for the state.
#include "ferry/broker/broker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <tuple>
#include "broker_impl.h"

#include "ferry/protocol/curve.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {

namespace {
constexpr int kMaxMessagesPerTurn = 512;  // per socket, before committing and dispatching
// And at most this long reading one socket in a turn, so that a burst of heavy messages on one
// socket cannot starve the other, the journal commit and the heartbeats.
constexpr int64_t kMaxReadMicrosPerTurn = 50'000;
constexpr int kFrontendSendHwm = 10'000;  // replies queued per producer connection
}  // namespace

Broker::Impl::Impl(const BrokerOptions& o)
    : options(o),
      keys(o.redis_prefix),
      scheduler(o.aging_every),
      journal(nullptr, keys),
      final_results(nullptr, keys) {}

Status Broker::Impl::InitCurve() {
  if (options.curve_secret.empty()) {
    if (!options.insecure) {
      for (const std::string* ep : {&options.frontend, &options.backend}) {
        if (!protocol::IsLoopbackEndpoint(*ep))
          return Status::InvalidArgument(
              *ep +
              " is reachable from other hosts, and without CURVE anyone who reaches it is a "
              "member: give --curve-secret with --allow-producers and --allow-workers "
              "(docs/security.md), bind 127.0.0.1, or pass --insecure");
      }
    }
    if (!options.allow_producers.empty() || !options.allow_workers.empty() ||
        !options.allow_operators.empty())
      return Status::InvalidArgument(
          "--allow-producers/--allow-workers/--allow-operators need "
          "--curve-secret");
    return Status::Ok();
  }
  if (options.allow_producers.empty() || options.allow_workers.empty())
    return Status::InvalidArgument(
        "--curve-secret needs --allow-producers DIR and --allow-workers DIR (the public keys "
        "admitted on each socket)");
  protocol::CurveKeyPair own;
  FERRY_RETURN_IF_ERROR(
      protocol::ReadCertificate(options.curve_secret, /*need_secret=*/true, &own));
  FERRY_RETURN_IF_ERROR(ZapHandler::Create(
      context, {options.allow_producers, options.allow_workers, options.allow_operators}, &zap));
  try {
    for (zmq::socket_t* s : {&frontend, &backend}) {
      s->set(zmq::sockopt::curve_server, 1);
      s->set(zmq::sockopt::curve_secretkey, own.secret_key);
    }
    frontend.set(zmq::sockopt::zap_domain, kProducersDomain);
    backend.set(zmq::sockopt::zap_domain, kWorkersDomain);
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("CURVE: ") + e.what());
  }
  spdlog::info("CURVE on: {} producer, {} worker and {} operator key(s) allowed", zap->producers(),
               zap->workers(), zap->operators());
  return Status::Ok();
}

bool Broker::Impl::ProducerAllowed(const protocol::Message& m) {
  if (!zap || zap->IsProducer(m.user_id) || zap->IsOperator(m.user_id)) return true;
  telemetry.OnRefusedMessage();
  return false;
}

bool Broker::Impl::WorkerAllowed(const protocol::Message& m) {
  if (!zap || zap->IsWorker(m.user_id)) return true;
  telemetry.OnRefusedMessage();
  return false;
}

void Broker::Impl::ReloadKeys() {
  if (!zap) {
    spdlog::info("SIGHUP: nothing to reload (CURVE is off)");
    return;
  }
  std::vector<std::string> broken;
  Status s = zap->Reload(&broken);
  if (!s.ok()) {
    spdlog::error("SIGHUP: keeping the previous allowed keys: {}", s.message());
    return;
  }
  // The rest applies (a revocation must not wait for another file to be mended); a broken file
  // keeps the key its name had, and a new one adds nothing until it reads.
  for (const auto& why : broken)
    spdlog::error(
        "SIGHUP: a key file that does not read (its member keeps its previous key, if "
        "any): {}",
        why);
  std::vector<std::string> revoked;
  for (const auto& [routing_id, w] : scheduler.workers())
    if (!zap->IsWorker(w.key)) revoked.push_back(routing_id);
  for (const auto& id : revoked) DropWorker(id, "its key is no longer allowed");
  spdlog::info(
      "SIGHUP: {} producer, {} worker and {} operator key(s) allowed; {} worker(s) dropped",
      zap->producers(), zap->workers(), zap->operators(), revoked.size());
}

Status Broker::Impl::InitRedis() {
  protocol::RedisEndpoint endpoint;
  FERRY_RETURN_IF_ERROR(
      protocol::ResolveRedisEndpoint(options.redis, options.redis_files, &endpoint));
  const int timeout_ms = static_cast<int>(options.redis_timeout_ms);
  // A wrong password, CA or database stops the broker now; a Redis that is down does not (the
  // journal's Restore needs it, and says so).
  bool refused = false;
  const Status access = protocol::CheckRedisAccess(endpoint, timeout_ms, &refused);
  if (!access.ok() && refused) return access;
  if (access.ok())
    spdlog::info("redis {} (user {}{})", endpoint.Describe(), endpoint.UserName(),
                 endpoint.tls ? ", TLS" : "");
  else
    spdlog::warn("redis {}: {}; retrying when needed", endpoint.Describe(), access.message());
  redis = protocol::RedisClient::Lazy(endpoint, timeout_ms);
  return Status::Ok();
}

Status Broker::Impl::Init() {
  FERRY_RETURN_IF_ERROR(InitCurve());
  FERRY_RETURN_IF_ERROR(InitRedis());
  journal = Journal(redis.get(), keys);
  final_results = FinalResults(redis.get(), keys);
  try {
    for (zmq::socket_t* s : {&frontend, &backend}) {
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::rcvhwm, 100000);
    }
    frontend.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    // Workers' DONEs carry inline records (at most kMaxDoneInlineBytes each): taken whatever
    // the producers' limit is (a DONE dropped with its connection leaves its jobs running).
    backend.set(zmq::sockopt::maxmsgsize,
                std::max(options.max_message_bytes, protocol::kMinWorkerMessageBytes));
    backend.set(zmq::sockopt::sndhwm, 100000);
    // Replies to producers: at most kFrontendSendHwm queued per producer, never a blocking send
    // (a reply that does not fit is dropped and counted: ferry_broker_replies_dropped_total).
    frontend.set(zmq::sockopt::sndhwm, kFrontendSendHwm);
    frontend.set(zmq::sockopt::sndtimeo, 0);
    frontend.set(zmq::sockopt::router_mandatory, 1);
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("socket options: ") + e.what());
  }
  for (auto [socket, endpoint, flag] : {std::tuple{&frontend, &options.frontend, "--frontend"},
                                        std::tuple{&backend, &options.backend, "--backend"}}) {
    try {
      socket->bind(*endpoint);
    } catch (const zmq::error_t& e) {
      return Status::Unavailable(std::string(flag) + " " + *endpoint + ": bind: " + e.what());
    }
  }
  if (options.journal) FERRY_RETURN_IF_ERROR(Restore());
  FERRY_RETURN_IF_ERROR(StartMetricsServer());
  return Status::Ok();
}

Status Broker::Impl::Restore() {
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<std::string> models;
  std::vector<std::pair<std::string, std::string>> unreadable;  // job id, why
  Status s = journal.Load(&jobs, &models, &unreadable);
  if (!s.ok()) return Status::Unavailable("cannot read the journal: " + s.message());
  // An accepted job whose record cannot be read is not lost silently: it fails, and its
  // producer's Wait finds why (its stored inputs, unknown now, expire).
  for (auto& [id, why] : unreadable) {
    spdlog::error("journal record of job {} cannot be read ({}); the job fails", id, why);
    auto job = std::make_unique<Job>();
    job->id = id;
    job->result_ttl_s = options.default_result_ttl_s;
    job->submitted_us = protocol::NowMicros();
    final_results.Add(std::move(job), "failed", codes::kInternal,
                      "the broker could not read this job's journal record after a restart (" +
                          why + "); the job did not run: submit it again");
  }
  for (const auto& m : models) scheduler.AddKnownModel(m);
  // The journal does not say which jobs were running: a worker may still run any of them, and
  // will claim it when it re-announces (READY "held"). A job whose deadline falls within the
  // time that takes is parked instead of queued: dispatched again or expired at once, it would
  // end `expired` though the worker running it finishes it.
  const int64_t park_before = protocol::NowMicros() + LivenessMicros();
  size_t n = 0;
  for (auto& job : jobs) {
    // Its model was known when it was accepted (the set of names may have expired since): so
    // its queue shows in STATS and the metrics, and --orphan-timeout-s fails it if no worker
    // of the model comes back (a parked one expires instead, unless its worker claims it).
    scheduler.AddKnownModel(job->model);
    const bool park = job->deadline_us > 0 && job->deadline_us < park_before;
    // In number order (Load sorted them); a row read twice (HSCAN) is one job.
    if (scheduler.AddRestored(std::move(job), park).ok()) ++n;
  }
  if (n > 0 || !models.empty())
    spdlog::info("restored {} job(s) and {} model name(s) from the journal", n, models.size());
  WatchRedisRestart();  // the Redis the journal was read from
  if (scheduler.parked() > 0)
    spdlog::info(
        "{} restored job(s) reach their deadline within {} ms: parked for that long, for the "
        "workers that may still run them to claim them; the others then expire",
        scheduler.parked(), LivenessMicros() / 1000);
  return Status::Ok();
}

void Broker::Impl::WatchRedisRestart() {
  if (!options.journal || redis->connects() == redis_connects_seen) return;
  redis_connects_seen = redis->connects();
  protocol::RedisReply info;
  // (A connection that broke is asked again after the next reconnect.)
  const Status s = redis->Command({"INFO", "server"}, &info);
  const std::string run_id = s.ok() ? metrics::InfoText(info.str, "run_id") : "";
  if (run_id.empty()) {
    if (redis->connected())  // answered, but not with a run_id: say so (rate-limited)
      LimitedWarn(redis_log,
                  "cannot tell whether Redis restarted and lost the journal: INFO "
                  "server gave no run_id (" +
                      (s.ok() ? std::string("none in the reply") : s.message()) +
                      "); the broker's Redis user needs +info");
    return;
  }
  if (run_id == redis_run_id) return;
  const bool first = redis_run_id.empty();
  redis_run_id = run_id;
  if (first) return;
  // Without persistence (or with snapshots only, or after a failover to a replica that lagged)
  // the journal may be gone or old: a broker that died now would restore too little. HSET is
  // idempotent, so everything pending is written again.
  const std::vector<std::string> ids = scheduler.PendingIds();
  spdlog::warn(
      "Redis restarted (its run_id changed): writing the {} pending job(s) and {} model name(s) "
      "to the journal again, in case it lost them",
      ids.size(), scheduler.known_models().size());
  for (const auto& id : ids) journal.Restage(id);
  for (const auto& model : scheduler.known_models()) journal.NoteModel(model);
}

void Broker::Impl::Dispatch() {
  Chunk chunk;
  while (scheduler.NextChunk(&chunk)) {
    const int64_t now = protocol::NowMicros();
    size_t size = 64;  // sized up front: no regrowth copies of the chunk's tensor bytes
    for (const Job* j : chunk.jobs)
      size += j->inputs_raw.size() + j->id.size() + j->model.size() + j->notify.size() + 160;
    msgpack::sbuffer buf(size);
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(chunk.jobs.size()));
    std::vector<zmq::message_t> frames;  // the jobs' attached inputs, in job and input order
    for (Job* j : chunk.jobs) {
      protocol::PackChunkEntry(pk, j->id, j->model, j->inputs_raw, j->attempt, j->priority,
                               j->result_ttl_s, j->submitted_us, now, j->deadline_us, j->notify);
      for (zmq::message_t& f : j->frames) {
        frames.emplace_back();
        frames.back().copy(f);  // shares the buffer (a reference count), copies no bytes
      }
    }
    protocol::SendTo(backend, chunk.worker, protocol::kChunk, protocol::ToMessage(std::move(buf)),
                     &frames);
    telemetry.OnChunk(chunk, now);
  }
}

void Broker::Impl::ExpireJobs() {
  const int64_t now = protocol::NowMicros();
  auto expired = scheduler.TakeExpired(now);
  if (parked_until_us != 0 && now >= parked_until_us) {
    parked_until_us = 0;
    auto parked = scheduler.TakeParked();
    if (!parked.empty())
      spdlog::info("{} parked job(s) expire: no worker claimed them after the restart",
                   parked.size());
    for (auto& job : parked) expired.push_back(std::move(job));
  }
  if (expired.empty()) return;
  spdlog::info("{} job(s) expired before they could start (first: {})", expired.size(),
               expired.front()->id);
  scheduler.mutable_counters().expired += static_cast<int64_t>(expired.size());
  for (auto& job : expired) {
    std::string message = "not started within timeout_ms=" + std::to_string(job->timeout_ms);
    final_results.Add(std::move(job), codes::kExpired, codes::kExpired, std::move(message));
  }
}

void Broker::Impl::FlushFinalResults() {
  if (final_results.empty()) return;
  std::vector<FinalResults::Written> written;
  Status s = final_results.Flush(&written);
  // Those Redis answered (some may be, when others failed) are finished now, and counted now:
  // an entry taken back before (a withdrawn acceptance: FinalResults::Remove) never is.
  std::vector<std::unique_ptr<Job>> jobs;
  for (auto& w : written) {
    // (A job whose journal record could not be read has no model to count it under: its
    // failure is logged by Restore.)
    if (!w.job->model.empty())
      telemetry.OnBrokerFinished(*w.job, w.code == codes::kPoisoned ? w.code : w.status);
    jobs.push_back(std::move(w.job));
  }
  Finish(std::move(jobs));
  if (!s.ok())
    LimitedWarn(redis_log, "writing " + std::to_string(final_results.size()) +
                               " broker result(s) failed: " + s.message() + "; will retry");
}

bool Broker::Impl::ReadBackend() {
  const int64_t turn_end = protocol::MonotonicMicros() + kMaxReadMicrosPerTurn;
  protocol::Message m;
  for (int i = 0; i < kMaxMessagesPerTurn; ++i) {
    if ((i & 15) == 15 && protocol::MonotonicMicros() > turn_end) return false;
    Status s = protocol::RecvMessage(backend, /*router=*/true, &m);
    if (s.code() == codes::kUnavailable) return true;  // read empty
    if (!s.ok()) {  // counted and rate-limited as any bad frame (security.md)
      telemetry.OnRefusedMessage();
      LimitedWarn(bad_worker_message_log,
                  "malformed worker message: " + protocol::Printable(s.message()));
      continue;
    }
    HandleBackend(m);
  }
  return false;
}

bool Broker::Impl::Heartbeat(int64_t now_mono) {
  if (now_mono < next_heartbeat_us) return false;
  next_heartbeat_us = now_mono + options.heartbeat_ms * 1000;
  // A worker is silent only when nothing of it waits unread: when the broker itself was busy
  // (a long turn, a slow journal write), the workers' messages are still in the socket, not
  // missing. So what waits is read first; a backlog more than a turn's worth of reading
  // postpones the verdict to the next heartbeat. (Deciding only when nothing waited let a busy
  // fleet, whose DONEs keep arriving, hold a dead worker's jobs for as long as it stayed busy.)
  bool unread = true;  // if the question fails (EINTR: a SIGHUP), read: an empty read says no
  try {
    unread = (backend.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  } catch (const zmq::error_t&) {
  }
  if (!unread || ReadBackend())
    for (const auto& id :
         scheduler.SilentWorkers(now_mono, options.heartbeat_ms * 1000, options.liveness))
      DropWorker(id, "silent");
  // (What was read is the next turn's to act on -- credit its DONEs freed, jobs requeued --
  // which the loop then runs at once.)
  // Each says the broker's interval: a worker heartbeating faster does not presume it dead
  // after its own liveness x interval.
  for (const auto& [id, w] : scheduler.workers())
    protocol::SendTo(backend, id, protocol::kHeartbeat,
                     protocol::EncodeHeartbeat(options.heartbeat_ms));
  // A Redis that restarted while the broker had nothing to write is noticed here, not at the
  // next write, while jobs are pending: their records go back into it at once. A connect tried
  // here waits a quarter of a heartbeat at most, so that a Redis out of reach does not hold up
  // the loop (writes keep their own --redis-timeout-ms).
  if (options.journal && scheduler.pending() > 0 &&
      (redis->DroppedByPeer() || !redis->connected())) {
    redis->SetTimeout(static_cast<int>(
        std::clamp<int64_t>(options.heartbeat_ms / 4, 1, options.redis_timeout_ms)));
    (void)redis->EnsureConnected();
    redis->SetTimeout(static_cast<int>(options.redis_timeout_ms));
  }
  WatchRedisRestart();
  // A fleet whose workers stay connected for over a week announces nothing in that time: the
  // models they serve are noted again hourly, so a restart still finds them in <prefix>models.
  if (options.journal && now_mono >= next_models_note_us) {
    next_models_note_us = now_mono + int64_t{3600} * 1000000;
    std::set<std::string> served;
    for (const auto& [id, w] : scheduler.workers())
      for (const auto& [model, max_batch] : w.max_batch) served.insert(model);
    for (const auto& model : served) journal.NoteModel(model);
  }
  return unread;
}

Broker::Broker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Broker::~Broker() = default;

Status Broker::Create(const BrokerOptions& options, std::unique_ptr<Broker>* out) {
  FERRY_RETURN_IF_ERROR(ValidateBrokerOptions(options));
  auto impl = std::make_unique<Impl>(options);
  FERRY_RETURN_IF_ERROR(impl->Init());
  out->reset(new Broker(std::move(impl)));
  return Status::Ok();
}

std::string Broker::frontend_endpoint() const {
  return impl_->frontend.get(zmq::sockopt::last_endpoint);
}
std::string Broker::backend_endpoint() const {
  return impl_->backend.get(zmq::sockopt::last_endpoint);
}
int Broker::metrics_port() const {
  return impl_->metrics_server ? impl_->metrics_server->port() : 0;
}

Status Broker::Run() {
  Impl& d = *impl_;
  spdlog::info("broker serving producers on {} and workers on {} (journal {})", frontend_endpoint(),
               backend_endpoint(), d.options.journal ? "on" : "off");
  zmq::pollitem_t items[] = {{d.backend.handle(), 0, ZMQ_POLLIN, 0},
                             {d.frontend.handle(), 0, ZMQ_POLLIN, 0},
                             {d.zap ? d.zap->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
  const int n_items = d.zap ? 3 : 2;
  protocol::Message m;
  bool turn_due = false;  // the heartbeat read workers' messages: a turn acts on them at once
  if (d.scheduler.parked() > 0) d.parked_until_us = protocol::NowMicros() + d.LivenessMicros();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (reload_.exchange(false, std::memory_order_relaxed)) d.ReloadKeys();
    // Journal removals wait for a ride with the next write, but not longer than a few ms.
    const int timeout_ms = turn_due                   ? 0
                           : !d.final_results.empty() ? 20
                           : d.journal.removals() > 0 ? 5
                                                      : 100;
    const int ready = protocol::PollSockets(items, n_items, timeout_ms);
    if (ready < 0) {
      if (zmq_errno() == EINTR) continue;
      return Status::Internal(std::string("poll: ") + zmq_strerror(zmq_errno()));
    }
    // Handshakes waiting for the ZAP handler's answer.
    if (d.zap && (items[2].revents & ZMQ_POLLIN)) d.zap->Handle();
    // Workers first: their DONEs free credit for the producers' new jobs. Only sockets that
    // poll reported readable are read (each empty read costs libzmq system calls).
    if (items[0].revents & ZMQ_POLLIN) d.ReadBackend();
    int64_t turn_end = protocol::MonotonicMicros() + kMaxReadMicrosPerTurn;
    for (int i = 0; (items[1].revents & ZMQ_POLLIN) && i < kMaxMessagesPerTurn; ++i) {
      if ((i & 15) == 15 && protocol::MonotonicMicros() > turn_end) break;
      Status s = protocol::RecvMessage(d.frontend, /*router=*/true, &m);
      if (s.code() == codes::kUnavailable) break;
      if (!s.ok()) {
        if (!m.envelope.empty()) d.ReplyError(m, 0, s.code(), s.message());
        continue;
      }
      d.HandleFrontend(m);
    }
    d.ExpireJobs();
    d.FailOrphans();
    // Dispatch before the journal round trip: the worker starts on this turn's jobs while the
    // broker waits for Redis. ACCEPTED still waits for the journal, and a DONE cannot overtake
    // it (it is read on a later turn, after CommitAndReply).
    d.Dispatch();
    d.CommitAndReply(/*quiet=*/ready == 0);
    d.FlushFinalResults();
    turn_due = d.Heartbeat(protocol::MonotonicMicros());
    d.telemetry.Refresh(d.scheduler, protocol::MonotonicMicros());
  }
  // Drain: what was read is answered, what is owed to Redis is written (best effort).
  d.CommitAndReply(/*quiet=*/true);
  d.FlushFinalResults();
  if (d.options.journal && !d.journal.idle())
    d.journal.Commit([&d](const std::string& id) { return d.scheduler.Find(id); });
  spdlog::info("broker stopped; {} job(s) pending{}", d.scheduler.pending(),
               d.options.journal ? " stay in the journal" : " are dropped (no journal)");
  return Status::Ok();
}

}  // namespace ferry::broker
