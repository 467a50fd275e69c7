#include "ferry/broker/broker.h"

#include <spdlog/spdlog.h>

#include <map>
#include <zmq.hpp>

#include "ferry/broker/scheduler.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::broker {

using protocol::Message;

namespace {
constexpr int kMaxMessagesPerTurn = 512;  // per socket, before dispatching
std::string Str(const zmq::message_t& m) { return std::string(m.to_string_view()); }
}  // namespace

struct Broker::Impl {
  BrokerOptions options;
  zmq::context_t context{1};
  zmq::socket_t frontend{context, zmq::socket_type::router};
  zmq::socket_t backend{context, zmq::socket_type::router};
  protocol::RedisEndpoint redis_endpoint;
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::Keys keys;
  Scheduler scheduler;
  int64_t next_heartbeat_us = 0;
  // Final results the broker writes itself (e.g. poisoned jobs), kept until Redis takes them.
  struct OwnResult {
    std::unique_ptr<Job> job;
    std::string code;
    std::string message;
  };
  std::vector<OwnResult> own_results;

  Status Init();
  void HandleFrontend(Message& m);
  void HandleBackend(Message& m);
  void HandleSubmit(Message& m, const msgpack::object& body, int64_t rid);
  void HandleStats(Message& m, int64_t rid);
  void Dispatch();
  void Heartbeat(int64_t now_mono);
  void DropWorker(const std::string& routing_id, const char* why);
  void FlushOwnResults();
  void NotifyFinished(const std::vector<const Job*>& jobs);
  void ReplyError(Message& m, int64_t rid, std::string_view code, std::string_view message) {
    protocol::SendMessage(frontend, &m.envelope, protocol::kError,
                          protocol::EncodeError(rid, code, message));
  }
};

Status Broker::Impl::Init() {
  FERRY_RETURN_IF_ERROR(protocol::ParseRedisUrl(options.redis, &redis_endpoint));
  keys = protocol::Keys(options.redis_prefix);
  try {
    for (zmq::socket_t* s : {&frontend, &backend}) {
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
      s->set(zmq::sockopt::sndhwm, 100000);
      s->set(zmq::sockopt::rcvhwm, 100000);
    }
    frontend.bind(options.frontend);
    backend.bind(options.backend);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("bind: ") + e.what());
  }
  Status s = protocol::RedisClient::Connect(redis_endpoint, 2000, &redis);
  if (!s.ok()) spdlog::warn("redis not reachable yet ({}); will retry", s.message());
  return Status::Ok();
}

void Broker::Impl::HandleFrontend(Message& m) {
  msgpack::object_handle oh;
  Status s = protocol::UnpackMap(m.body.data(), m.body.size(), &oh);
  int64_t rid = 0;
  if (s.ok()) s = protocol::GetInt(oh.get(), "rid", &rid, 0);
  if (!s.ok()) {
    if (!m.envelope.empty()) ReplyError(m, rid, codes::kMalformed, s.message());
    return;
  }
  if (m.command == protocol::kSubmit) {
    HandleSubmit(m, oh.get(), rid);
  } else if (m.command == protocol::kStats) {
    HandleStats(m, rid);
  } else {
    ReplyError(m, rid, "unknown_command", "unknown command \"" + m.command + "\"");
  }
}

void Broker::Impl::HandleSubmit(Message& m, const msgpack::object& body, int64_t rid) {
  const msgpack::object* jobs = protocol::Find(body, "jobs");
  if (!jobs || jobs->type != msgpack::type::ARRAY) {
    ReplyError(m, rid, codes::kMalformed, "SUBMIT needs \"jobs\": an array of job maps");
    return;
  }
  protocol::Accepted reply;
  reply.rid = rid;
  std::string producer = m.envelope.empty() ? "" : Str(m.envelope[0]);
  int64_t now = protocol::NowMicros();
  protocol::SubmitJob in;
  for (uint32_t i = 0; i < jobs->via.array.size; ++i) {
    Status s = protocol::DecodeSubmitJob(jobs->via.array.ptr[i], &in);
    if (s.ok() && !scheduler.KnowsModel(in.model))
      s = Status(codes::kUnknownModel, "no worker serves model \"" + in.model + "\"");
    if (s.ok()) {
      size_t bytes = 0;
      for (const auto& t : in.inputs) bytes += t.size;
      if (static_cast<int64_t>(bytes) > options.max_job_bytes)
        s = Status(codes::kTooLarge, "job inputs are " + std::to_string(bytes) +
                                         " bytes; the limit is " +
                                         std::to_string(options.max_job_bytes));
    }
    if (s.ok() && scheduler.IsPending(in.id))
      s = Status(codes::kDuplicate, "a job with this id is pending");
    if (!s.ok()) {
      reply.rejected.push_back({in.id, s.code(), s.message()});
      continue;
    }
    auto job = std::make_unique<Job>();
    job->id = in.id;
    job->model = in.model;
    job->priority = in.priority;
    job->timeout_ms = in.timeout_ms;
    job->result_ttl_s = in.result_ttl_s > 0 ? in.result_ttl_s : options.default_result_ttl_s;
    job->submitted_us = now;
    job->producer = producer;
    msgpack::sbuffer raw;
    msgpack::pack(raw, *in.inputs_obj);
    job->inputs_raw.assign(raw.data(), raw.size());
    scheduler.Add(std::move(job));
    reply.ids.push_back(in.id);
  }
  scheduler.mutable_counters().rejected += static_cast<int64_t>(reply.rejected.size());
  protocol::SendMessage(frontend, &m.envelope, protocol::kAccepted,
                        protocol::EncodeAccepted(reply));
}

void Broker::Impl::HandleStats(Message& m, int64_t rid) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  int64_t now_mono = protocol::MonotonicMicros();
  pk.pack_map(rid ? 5 : 4);
  protocol::PackString(pk, "workers");
  pk.pack_array(static_cast<uint32_t>(scheduler.workers().size()));
  for (const auto& [rid_w, w] : scheduler.workers()) {
    pk.pack_map(9);
    protocol::PackString(pk, "id");
    protocol::PackString(pk, w.hello.worker);
    protocol::PackString(pk, "device");
    protocol::PackString(pk, w.hello.device);
    protocol::PackString(pk, "host");
    protocol::PackString(pk, w.hello.host);
    protocol::PackString(pk, "pid");
    pk.pack_int64(w.hello.pid);
    protocol::PackString(pk, "models");
    pk.pack_array(static_cast<uint32_t>(w.max_batch.size()));
    for (const auto& [name, mb] : w.max_batch) protocol::PackString(pk, name);
    protocol::PackString(pk, "capacity");
    pk.pack_int64(w.hello.capacity);
    protocol::PackString(pk, "credit");
    pk.pack_int64(w.credit());
    protocol::PackString(pk, "in_flight");
    pk.pack_int64(static_cast<int64_t>(w.in_flight.size()));
    protocol::PackString(pk, "last_seen_ms");
    pk.pack_int64((now_mono - w.last_seen_us) / 1000);
  }
  protocol::PackString(pk, "queues");
  auto depths = scheduler.QueueDepths();
  pk.pack_map(static_cast<uint32_t>(depths.size()));
  for (const auto& [model, depth] : depths) {
    protocol::PackString(pk, model);
    pk.pack_uint64(depth);
  }
  protocol::PackString(pk, "pending");
  pk.pack_uint64(scheduler.pending());
  const auto& c = scheduler.counters();
  protocol::PackString(pk, "counters");
  protocol::PackIntMap(pk, {{"accepted", c.accepted},
                            {"rejected", c.rejected},
                            {"finished", c.finished},
                            {"requeued", c.requeued},
                            {"chunks", c.chunks},
                            {"dispatched", c.dispatched}});
  if (rid) {
    protocol::PackString(pk, "rid");
    pk.pack_int64(rid);
  }
  protocol::SendMessage(frontend, &m.envelope, protocol::kStats, protocol::ToMessage(std::move(buf)));
}

void Broker::Impl::HandleBackend(Message& m) {
  std::string worker = Str(m.envelope[0]);
  int64_t now_mono = protocol::MonotonicMicros();
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
    bool known = scheduler.HasWorker(worker);
    // A worker name is unique: the same name on a new connection is that worker restarted or
    // reconnected, and the old connection is dead.
    std::vector<std::string> stale;
    for (const auto& [rid_w, w] : scheduler.workers())
      if (rid_w != worker && w.hello.worker == hello.worker) stale.push_back(rid_w);
    for (const auto& id : stale) DropWorker(id, "replaced by a new connection");
    std::string models;
    for (const auto& mi : hello.models) models += (models.empty() ? "" : ",") + mi.name;
    spdlog::info("worker {} {} on {} (capacity {}, models {})", hello.worker,
                 known ? "re-announced" : "joined", hello.device, hello.capacity, models);
    scheduler.AddWorker(worker, std::move(hello), now_mono);
    return;
  }
  if (!scheduler.HasWorker(worker)) {
    // We do not know this worker (we restarted, or dropped it as silent): ask it to announce.
    if (m.command != protocol::kBye)
      protocol::SendMessage(backend, &m.envelope, protocol::kReannounce, protocol::EncodeEmpty());
    return;
  }
  scheduler.Touch(worker, now_mono);
  if (m.command == protocol::kDone) {
    std::vector<std::string> ids;
    s = protocol::GetStringArray(oh.get(), "ids", &ids);
    if (!s.ok()) {
      spdlog::warn("bad DONE from worker: {}", s.message());
      return;
    }
    auto finished = scheduler.Complete(worker, ids);
    std::vector<const Job*> views;
    for (const auto& j : finished) views.push_back(j.get());
    NotifyFinished(views);
  } else if (m.command == protocol::kBye) {
    DropWorker(worker, "said BYE");
  } else if (m.command != protocol::kHeartbeat) {
    spdlog::warn("unknown worker command {}", m.command);
  }
}

void Broker::Impl::NotifyFinished(const std::vector<const Job*>& jobs) {
  std::map<std::string, std::vector<std::string>> by_producer;
  for (const Job* j : jobs) {
    if (!j->producer.empty()) by_producer[j->producer].push_back(j->id);
  }
  for (auto& [producer, ids] : by_producer)
    protocol::SendTo(frontend, producer, protocol::kFinished, protocol::EncodeIds(ids));
}

void Broker::Impl::DropWorker(const std::string& routing_id, const char* why) {
  auto it = scheduler.workers().find(routing_id);
  std::string name = it != scheduler.workers().end() ? it->second.hello.worker : "?";
  auto requeued = scheduler.RemoveWorker(routing_id);
  spdlog::warn("worker {} removed ({}); {} job(s) requeued", name, why, requeued.size());
  for (Job* job : requeued) {
    if (job->attempt > options.max_attempts) {
      std::string message = "job was running on " + std::to_string(job->attempt - 1) +
                            " workers that died; giving up after " +
                            std::to_string(options.max_attempts) + " attempts";
      spdlog::warn("job {} poisoned: {}", job->id, message);
      own_results.push_back({scheduler.Take(job->id), "poisoned", message});
    }
  }
}

void Broker::Impl::FlushOwnResults() {
  if (own_results.empty()) return;
  if (!redis) {
    if (!protocol::RedisClient::Connect(redis_endpoint, 2000, &redis).ok()) return;
  }
  int64_t now = protocol::NowMicros();
  for (const auto& r : own_results) {
    protocol::ResultRecord rec;
    rec.id = r.job->id;
    rec.status = "failed";
    rec.model = r.job->model;
    rec.error_code = r.code;
    rec.error_message = r.message;
    rec.attempt = r.job->attempt - 1;
    rec.timing_us = {{"submitted", r.job->submitted_us}, {"finished", now}};
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    protocol::PackResult(pk, rec);
    std::string ttl = std::to_string(r.job->result_ttl_s);
    redis->Append({"SET", keys.Result(r.job->id), std::string_view(buf.data(), buf.size()), "EX",
                   ttl, "NX"});
  }
  Status s = redis->Flush(nullptr);
  if (!s.ok()) {
    spdlog::warn("writing {} broker result(s) failed: {}; will retry", own_results.size(),
                 s.message());
    return;
  }
  std::vector<const Job*> views;
  for (const auto& r : own_results) views.push_back(r.job.get());
  NotifyFinished(views);
  own_results.clear();
}

void Broker::Impl::Dispatch() {
  Chunk chunk;
  while (scheduler.NextChunk(&chunk)) {
    int64_t now = protocol::NowMicros();
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    pk.pack_map(1);
    protocol::PackString(pk, "jobs");
    pk.pack_array(static_cast<uint32_t>(chunk.jobs.size()));
    for (const Job* j : chunk.jobs) {
      protocol::PackChunkEntry(pk, j->id, j->model, j->inputs_raw, j->attempt, j->priority,
                               j->result_ttl_s, j->submitted_us, now);
    }
    protocol::SendTo(backend, chunk.worker, protocol::kChunk, protocol::ToMessage(std::move(buf)));
  }
}

void Broker::Impl::Heartbeat(int64_t now_mono) {
  if (now_mono < next_heartbeat_us) return;
  next_heartbeat_us = now_mono + options.heartbeat_ms * 1000;
  int64_t deadline = now_mono - options.heartbeat_ms * options.liveness * 1000;
  for (const auto& id : scheduler.SilentWorkers(deadline)) DropWorker(id, "silent");
  for (const auto& [id, w] : scheduler.workers())
    protocol::SendTo(backend, id, protocol::kHeartbeat, protocol::EncodeEmpty());
}

Broker::Broker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Broker::~Broker() = default;

Status Broker::Create(const BrokerOptions& options, std::unique_ptr<Broker>* out) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
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

Status Broker::Run() {
  Impl& d = *impl_;
  spdlog::info("broker serving producers on {} and workers on {}", frontend_endpoint(),
               backend_endpoint());
  zmq::pollitem_t items[] = {{d.backend.handle(), 0, ZMQ_POLLIN, 0},
                             {d.frontend.handle(), 0, ZMQ_POLLIN, 0}};
  Message m;
  while (!stop_.load(std::memory_order_relaxed)) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return Status::Internal(std::string("poll: ") + e.what());
    }
    // Workers first: their DONEs free credit for the producers' new jobs.
    for (int i = 0; i < kMaxMessagesPerTurn; ++i) {
      Status s = protocol::RecvMessage(d.backend, /*router=*/true, &m);
      if (s.code() == codes::kUnavailable) break;
      if (!s.ok()) {
        spdlog::warn("malformed worker message: {}", s.message());
        continue;
      }
      d.HandleBackend(m);
    }
    for (int i = 0; i < kMaxMessagesPerTurn; ++i) {
      Status s = protocol::RecvMessage(d.frontend, /*router=*/true, &m);
      if (s.code() == codes::kUnavailable) break;
      if (!s.ok()) {
        if (!m.envelope.empty()) d.ReplyError(m, 0, s.code(), s.message());
        continue;
      }
      d.HandleFrontend(m);
    }
    d.Dispatch();
    d.FlushOwnResults();
    d.Heartbeat(protocol::MonotonicMicros());
  }
  spdlog::info("broker stopping; {} job(s) pending", d.scheduler.pending());
  return Status::Ok();
}

}  // namespace ferry::broker
