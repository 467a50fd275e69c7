// Producer-facing handlers: SUBMIT, CANCEL, STATS, and the replies.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "admission.h"
#include "broker_impl.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {

namespace {
std::string Str(const zmq::message_t& m) { return std::string(m.to_string_view()); }

// Attached frames up to this size are copied rather than kept (see HandleSubmit).
constexpr size_t kOwnFrameBelowBytes = 8192;

// STATS "models": {model: {"specs": [{"inputs"?: [spec], "workers": [name]}]}} -- every known
// model, with the workers serving it grouped by the input spec they announced (no "inputs": not
// declared). Specs the broker still checks although no worker serves the model now are listed
// with no workers.
void PackModels(protocol::Packer& pk, const Scheduler& scheduler) {
  using Specs = std::optional<std::vector<protocol::InputSpec>>;
  std::map<std::string, std::vector<std::pair<Specs, std::vector<std::string>>>> groups;
  for (const auto& model : scheduler.known_models()) groups[model];
  for (const auto& [rid, w] : scheduler.workers()) {
    for (const auto& mi : w.hello.models) {
      auto& list = groups[mi.name];
      auto it = std::find_if(list.begin(), list.end(),
                             [&](const auto& g) { return g.first == mi.inputs; });
      if (it == list.end()) it = list.insert(list.end(), {mi.inputs, {}});
      it->second.push_back(w.hello.worker);
    }
  }
  for (auto& [model, list] : groups) {
    const auto* specs = scheduler.SpecsOf(model);
    if (!list.empty() || specs == nullptr) continue;
    for (const auto& spec : *specs) list.push_back({spec, {}});
  }
  pk.pack_map(static_cast<uint32_t>(groups.size()));
  for (auto& [model, list] : groups) {
    protocol::PackString(pk, model);
    pk.pack_map(1);
    protocol::PackString(pk, "specs");
    pk.pack_array(static_cast<uint32_t>(list.size()));
    for (auto& [spec, workers] : list) {
      std::sort(workers.begin(), workers.end());
      pk.pack_map(spec ? 2 : 1);
      if (spec) {
        protocol::PackString(pk, "inputs");
        protocol::PackInputSpecs(pk, *spec);
      }
      protocol::PackString(pk, "workers");
      pk.pack_array(static_cast<uint32_t>(workers.size()));
      for (const auto& name : workers) protocol::PackString(pk, name);
    }
  }
}
}  // namespace

void Broker::Impl::Reply(const std::vector<zmq::message_t>& envelope, std::string_view command,
                         zmq::message_t body) {
  // The frontend never blocks (SNDTIMEO 0, ROUTER_MANDATORY): a producer that does not read its
  // replies, or has gone, loses this one -- counted -- instead of growing the broker's memory:
  // past ZeroMQ's 10,000 messages queued for it, or past its bytes queued (reply_backlog.h).
  const std::string_view producer = envelope.at(0).to_string_view();
  const auto bytes = static_cast<int64_t>(body.size());
  if (!reply_backlog.Admits(producer, bytes)) {
    telemetry.OnReplyDropped();
    return;
  }
  body = reply_backlog.Track(producer, std::move(body), bytes);
  if (!protocol::SendMessage(frontend, &envelope, command, std::move(body)).ok())
    telemetry.OnReplyDropped();
}

void Broker::Impl::ReplyError(protocol::Message& m, int64_t rid, std::string_view code,
                              std::string_view message) {
  telemetry.OnRefusedMessage();
  Reply(m.envelope, protocol::kError, protocol::EncodeError(rid, code, message));
}

void Broker::Impl::HandleFrontend(protocol::Message& m) {
  if (!ProducerAllowed(m)) {
    LimitedWarn(refused_log, "dropped a producer message from a key that is no longer allowed");
    return;
  }
  msgpack::object_handle oh;
  Status s = protocol::UnpackMap(m.body.data(), m.body.size(), &oh);
  int64_t rid = 0;
  if (s.ok()) s = protocol::GetInt(oh.get(), "rid", &rid, 0);
  if (!s.ok()) {
    if (!m.envelope.empty()) ReplyError(m, rid, codes::kMalformed, s.message());
    return;
  }
  if (!m.frames.empty() && m.command != protocol::kSubmit) {
    ReplyError(m, rid, codes::kMalformed, "only SUBMIT carries data frames after the body");
    return;
  }
  if (m.command == protocol::kSubmit) {
    HandleSubmit(m, oh.get(), rid);
  } else if (m.command == protocol::kCancel) {
    HandleCancel(m, oh.get(), rid);
  } else if (m.command == protocol::kStats) {
    HandleStats(m, rid);
  } else if (m.command == protocol::kLimits) {
    // A client asks first thing on each connection, so that it never sends a frame over
    // --max-message-bytes (libzmq would drop the connection without an answer).
    Reply(
        m.envelope, protocol::kLimits,
        protocol::EncodeLimits(
            {options.max_message_bytes, options.max_job_bytes, options.max_jobs_per_message}, rid));
  } else {
    ReplyError(m, rid, "unknown_command", "unknown command \"" + m.command + "\"");
  }
}

void Broker::Impl::HandleSubmit(protocol::Message& m, const msgpack::object& body, int64_t rid) {
  const msgpack::object* jobs = protocol::Find(body, "jobs");
  if (!jobs || jobs->type != msgpack::type::ARRAY) {
    ReplyError(m, rid, codes::kMalformed, "SUBMIT needs \"jobs\": an array of job maps");
    return;
  }
  if (static_cast<int64_t>(jobs->via.array.size) > options.max_jobs_per_message) {
    ReplyError(m, rid, codes::kTooLarge,
               "SUBMIT of " + std::to_string(jobs->via.array.size) + " jobs; at most " +
                   std::to_string(options.max_jobs_per_message) + " per message");
    return;
  }
  const msgpack::object* inline_flag = protocol::Find(body, "inline_results");
  const bool inline_results = inline_flag != nullptr &&
                              inline_flag->type == msgpack::type::BOOLEAN &&
                              inline_flag->via.boolean;
  // "notify": the producer's Pub/Sub channel; the worker publishes each result notice there too.
  std::string notify;
  if (const msgpack::object* n = protocol::Find(body, "notify")) {
    notify = std::string(protocol::AsStringView(*n));
    if (n->type != msgpack::type::STR || !keys.IsNotifyChannel(notify)) {
      ReplyError(m, rid, codes::kInvalidArgument,
                 "SUBMIT \"notify\" must be a string \"" + keys.NotifyChannel("TOKEN") +
                     "\" with TOKEN 1-128 characters of [A-Za-z0-9._:-]");
      return;
    }
  }
  // "ack": false -- the producer waits for the results, not for ACCEPTED: send it only to report
  // rejections (the SDK's Client::Run; one message fewer per job at light load).
  bool ack = true;
  if (const msgpack::object* a = protocol::Find(body, "ack")) {
    if (a->type != msgpack::type::BOOLEAN) {
      ReplyError(m, rid, codes::kInvalidArgument, "SUBMIT \"ack\" must be true or false");
      return;
    }
    ack = a->via.boolean;
  }
  // Attached inputs: the data frames after the body, one per "attached" tensor, in order.
  if (const size_t want = protocol::AttachedCount(*jobs); want != m.frames.size()) {
    ReplyError(m, rid, codes::kMalformed,
               "SUBMIT has " + std::to_string(want) + " attached input(s) and " +
                   std::to_string(m.frames.size()) + " data frame(s)");
    return;
  }
  size_t message_bytes = m.body.size();
  for (const auto& f : m.frames) message_bytes += f.size();
  if (static_cast<int64_t>(message_bytes) > options.max_message_bytes) {
    ReplyError(m, rid, codes::kTooLarge,
               "SUBMIT of " + std::to_string(message_bytes) +
                   " bytes with its data frames; at most " +
                   std::to_string(options.max_message_bytes) + " (--max-message-bytes)");
    return;
  }
  PendingReply reply;
  reply.accepted.rid = rid;
  reply.ack = ack;
  const std::string producer = m.envelope.empty() ? "" : Str(m.envelope[0]);
  const int64_t now = protocol::NowMicros();
  protocol::SubmitJob in;
  size_t next_frame = 0;
  for (uint32_t i = 0; i < jobs->via.array.size; ++i) {
    // This job's frames: as many as its tensors marked attached, valid or not.
    const size_t first_frame = next_frame;
    next_frame += protocol::AttachedInJob(jobs->via.array.ptr[i]);
    Status s = protocol::DecodeSubmitJob(jobs->via.array.ptr[i], &in);
    if (s.ok())
      s = protocol::MatchFrames(&in.inputs, m.frames.data() + first_frame,
                                next_frame - first_frame);
    if (s.ok()) s = Admit(in, scheduler, options);
    // The results the broker writes itself wait in it while Redis does not take them (down;
    // without the journal, jobs are still accepted then): at most --max-queue of them.
    if (s.ok() && static_cast<int64_t>(final_results.size()) >= options.max_queue)
      s = Status::Unavailable(std::to_string(final_results.size()) +
                              " results of jobs the broker ended wait for Redis to take them; "
                              "retry later");
    // A pending id is a duplicate whatever else is wrong with the job (Admit checks it first):
    // any other rejection tells the producer that the job's stored inputs are its own to delete.
    if (!s.ok() && s.code() != codes::kDuplicate && protocol::IsValidJobId(in.id) &&
        scheduler.IsPending(in.id))
      s = Status(codes::kDuplicate, "a job with this id is pending");
    if (!s.ok()) {
      reply.accepted.rejected.push_back({in.id, s.code(), s.message()});
      continue;
    }
    auto job = std::make_unique<Job>();
    job->id = in.id;
    job->model = in.model;
    job->priority = in.priority;
    job->timeout_ms = in.timeout_ms;
    job->result_ttl_s = in.result_ttl_s > 0 ? in.result_ttl_s : options.default_result_ttl_s;
    job->submitted_us = now;
    // Saturated: a timeout past the end of time means none (INT64_MAX overflowed into "expired
    // at once" before).
    job->deadline_us = in.timeout_ms <= 0                          ? 0
                       : in.timeout_ms >= (INT64_MAX - now) / 1000 ? 0
                                                                   : now + in.timeout_ms * 1000;
    job->producer = producer;
    job->owner = m.user_id;
    job->inline_result = inline_results;
    job->notify = notify;
    size_t hint = 16;  // the msgpack framing is a few dozen bytes per tensor
    for (const auto& t : in.inputs) {
      hint += (t.stored || t.attached ? 0 : t.size) + 64;
      if (t.stored) job->stored_bytes += static_cast<int64_t>(t.size);
      if (t.attached) job->attached_bytes += static_cast<int64_t>(t.size);
    }
    for (size_t f = first_frame; f < next_frame; ++f) {
      // A small frame may lie in libzmq's shared receive buffer (ZMQ_IN_BATCH_SIZE, 8 KiB),
      // which it would keep alive for as long as the job waits: such a frame is copied, so that
      // the pending bytes count what is held. A big one is its own buffer: kept as received.
      zmq::message_t& frame = m.frames[f];
      if (frame.size() <= kOwnFrameBelowBytes)
        job->frames.emplace_back(frame.data(), frame.size());
      else
        job->frames.push_back(std::move(frame));
    }
    // (in.inputs' attached tensors pointed into m.frames: not used past this point.)
    job->stored_inputs = protocol::StoredInputs(in.inputs);
    protocol::PackObjectInto(*in.inputs_obj, hint, &job->inputs_raw);  // one copy
    scheduler.Add(std::move(job));
    const Job* added = scheduler.Find(in.id);
    if (options.journal) journal.Stage(*added);
    reply.accepted.ids.push_back(in.id);
    reply.seqs.push_back(added->seq);
    first_unreplied_seq = std::min(first_unreplied_seq, added->seq);
    reply.models.push_back(added->model);
  }
  scheduler.mutable_counters().rejected += static_cast<int64_t>(reply.accepted.rejected.size());
  reply.envelope = std::move(m.envelope);
  pending_replies.push_back(std::move(reply));
}

void Broker::Impl::CommitAndReply(bool quiet) {
  constexpr int64_t kRemovalDelayUs = 5000;      // removals wait at most this for a ride
  constexpr size_t kMaxDeferredRemovals = 4096;  // or until this many have piled up
  const bool removals_due =
      quiet || journal.removals() >= kMaxDeferredRemovals ||
      (journal.removals() > 0 &&
       protocol::MonotonicMicros() - journal.oldest_removal_us() >= kRemovalDelayUs);
  if (options.journal && (journal.has_writes() || (removals_due && !journal.idle()))) {
    const bool had_jobs = journal.has_staged();
    Status s = journal.Commit([this](const std::string& id) { return scheduler.Find(id); });
    if (!s.ok() && had_jobs) {
      // This turn's jobs are not durable: take them back and say why. Some may already be on a
      // worker (Dispatch runs before the commit so that the worker starts while the journal
      // write is in flight); that worker still runs them and its result lands in Redis, which a
      // retry with the same id then finds (the retry's own result is fenced as a duplicate).
      // A job that already ended in this turn (cancelled, expired) stays accepted when its
      // result is in Redis: a rejection beside it would tell the producer two fates. One whose
      // result still waits for Redis (down, as the journal write just showed) is not durable --
      // a broker that died now would leave neither record nor result -- so its result is taken
      // back and it is rejected like the others.
      spdlog::warn("journal write failed ({}); rejecting this turn's jobs as unavailable",
                   s.message());
      int64_t n = 0;
      for (auto& reply : pending_replies) {
        std::vector<std::string> ended, ended_models;
        for (size_t i = 0; i < reply.accepted.ids.size(); ++i) {
          std::string& id = reply.accepted.ids[i];
          const Job* job = scheduler.Find(id);
          if (job == nullptr || job->seq != reply.seqs[i]) {  // not this SUBMIT's job any more
            const std::string what = final_results.Remove(id, reply.seqs[i]);
            if (what.empty()) {
              ended.push_back(std::move(id));
              ended_models.push_back(std::move(reply.models[i]));
              continue;
            }
            SchedulerCounters& c = scheduler.mutable_counters();  // it did not end after all
            if (what == codes::kCancelled) --c.cancelled;
            if (what == codes::kExpired) --c.expired;
            if (what == codes::kPoisoned) --c.poisoned;
          } else {
            scheduler.Take(id);
          }
          reply.accepted.rejected.push_back(
              {id, codes::kUnavailable, "the broker cannot journal jobs: Redis: " + s.message()});
          ++n;
        }
        reply.accepted.ids = std::move(ended);
        reply.models = std::move(ended_models);
        reply.seqs.clear();  // not read past this point
      }
      scheduler.mutable_counters().accepted -= n;
      scheduler.mutable_counters().rejected += n;
    }
  }
  for (auto& reply : pending_replies) {
    telemetry.OnReply(reply.accepted, reply.models);
    if (!reply.ack && reply.accepted.rejected.empty()) continue;  // all accepted: nothing to say
    Reply(reply.envelope, protocol::kAccepted, protocol::EncodeAccepted(reply.accepted));
  }
  pending_replies.clear();
  first_unreplied_seq = INT64_MAX;
  if (!held_finished.empty()) NotifyFinished(std::exchange(held_finished, {}), {}, {});
}

void Broker::Impl::HandleCancel(protocol::Message& m, const msgpack::object& body, int64_t rid) {
  const msgpack::object* raw_ids = protocol::Find(body, "ids");
  if (raw_ids != nullptr && raw_ids->type == msgpack::type::ARRAY &&
      static_cast<int64_t>(raw_ids->via.array.size) > options.max_jobs_per_message) {
    ReplyError(m, rid, codes::kTooLarge,
               "CANCEL of " + std::to_string(raw_ids->via.array.size) + " ids; at most " +
                   std::to_string(options.max_jobs_per_message) + " per message");
    return;
  }
  std::vector<std::string> ids;
  Status s = protocol::GetStringArray(body, "ids", &ids);
  if (!s.ok()) {
    ReplyError(m, rid, codes::kMalformed, "CANCEL needs \"ids\": " + s.message());
    return;
  }
  protocol::Cancelled reply;
  reply.rid = rid;
  // With CURVE a producer cancels only the jobs submitted under its own key; an operator key,
  // any. (Another producer's job is reported not_found: its existence is not told either.)
  const bool any_job = !zap || zap->IsOperator(m.user_id);
  std::map<std::string, std::vector<std::string>> by_worker;
  enum class Fate : char { kNotFound, kCancelledHere, kRunning };
  std::vector<Fate> fates;  // per id of the request, for the lists in request order
  fates.reserve(ids.size());
  for (const auto& id : ids) {
    const Job* job = scheduler.Find(id);
    if (!job || (!any_job && job->owner != m.user_id)) {
      fates.push_back(Fate::kNotFound);
    } else if (job->phase != JobPhase::kDispatched) {  // queued or parked
      final_results.Add(scheduler.Take(id), codes::kCancelled, codes::kCancelled,
                        "cancelled by request");
      ++scheduler.mutable_counters().cancelled;
      fates.push_back(Fate::kCancelledHere);
    } else {
      by_worker[job->worker].push_back(id);
      fates.push_back(Fate::kRunning);
    }
  }
  // The queued jobs' `cancelled` results are in Redis before CANCELLED says so: a broker that
  // dies right after must not restore them from its journal and run them. Those Redis did not
  // take (it is down) are not final yet: they are reported `running`, whose result tells. The
  // broker writes `cancelled` once Redis is back; a broker that dies first restores the job
  // from its journal (if it keeps one) and runs it.
  std::unordered_set<std::string_view> unwritten;  // views into final_results: used right away
  if (std::find(fates.begin(), fates.end(), Fate::kCancelledHere) != fates.end()) {
    FlushFinalResults();
    if (!final_results.empty()) unwritten = final_results.PendingIds();
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (fates[i] == Fate::kNotFound)
      reply.not_found.push_back(ids[i]);
    else if (fates[i] == Fate::kCancelledHere && unwritten.count(ids[i]) == 0)
      reply.ids.push_back(ids[i]);
    else
      reply.running.push_back(ids[i]);
  }
  for (const auto& [worker, list] : by_worker)
    protocol::SendTo(backend, worker, protocol::kCancel, protocol::EncodeIds(list));
  Reply(m.envelope, protocol::kCancelled, protocol::EncodeCancelled(reply));
}

void Broker::Impl::HandleStats(protocol::Message& m, int64_t rid) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  const int64_t now_mono = protocol::MonotonicMicros();
  pk.pack_map(rid ? 6 : 5);
  protocol::PackString(pk, "models");
  PackModels(pk, scheduler);
  protocol::PackString(pk, "workers");
  pk.pack_array(static_cast<uint32_t>(scheduler.workers().size()));
  for (const auto& [routing_id, w] : scheduler.workers()) {
    pk.pack_map(10);
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
    protocol::PackString(pk, "resident");  // all models when the worker did not say
    std::vector<std::string> resident;
    for (const auto& [name, mb] : w.max_batch)
      if (w.IsWarm(name)) resident.push_back(name);
    pk.pack_array(static_cast<uint32_t>(resident.size()));
    for (const auto& name : resident) protocol::PackString(pk, name);
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
                            {"dispatched", c.dispatched},
                            {"duplicates", c.duplicates},
                            {"expired", c.expired},
                            {"cancelled", c.cancelled},
                            {"poisoned", c.poisoned}});
  if (rid) {
    protocol::PackString(pk, "rid");
    pk.pack_int64(rid);
  }
  Reply(m.envelope, protocol::kStats, protocol::ToMessage(std::move(buf)));
}

void Broker::Impl::NotifyFinished(const std::vector<std::unique_ptr<Job>>& jobs,
                                  const protocol::InlineResults& results,
                                  const std::vector<std::string>& notified) {
  // Jobs whose worker published the notice on their producer's channel need no FINISHED (only
  // jobs that named one: a DONE cannot switch off another producer's notices).
  std::unordered_set<std::string_view> skip;
  for (const auto& id : notified) skip.insert(id);
  std::unordered_map<std::string_view, std::string_view> record_of;
  if (!results.empty()) {
    record_of.reserve(results.size());
    for (const auto& [id, record] : results) record_of.emplace(id, record);
  }
  struct Notice {
    std::vector<std::string> ids;
    protocol::InlineResults results;
    int64_t inline_bytes = 0;  // of `results`' records
  };
  std::map<std::string_view, Notice> by_producer;
  int64_t withheld = 0;
  for (const auto& j : jobs) {
    if (j->producer.empty() || (!j->notify.empty() && skip.count(j->id) > 0)) continue;
    // A producer whose key was removed (SIGHUP) gets nothing more.
    if (zap && !zap->IsProducer(j->owner) && !zap->IsOperator(j->owner)) continue;
    Notice& n = by_producer[j->producer];
    n.ids.push_back(j->id);
    if (!j->inline_result || record_of.empty()) continue;
    auto it = record_of.find(j->id);
    if (it == record_of.end()) continue;
    const auto bytes = static_cast<int64_t>(it->second.size());
    if (!reply_backlog.Fits(j->producer, n.inline_bytes + bytes)) {
      ++withheld;  // the producer reads this one from Redis (reply_backlog.h)
      continue;
    }
    n.results.emplace_back(j->id, it->second);
    n.inline_bytes += bytes;
  }
  if (withheld > 0) telemetry.OnInlineResultsWithheld(withheld);
  auto send = [&](std::string_view producer, const std::vector<std::string>& ids,
                  const protocol::InlineResults& results) {
    std::vector<zmq::message_t> envelope(1);
    envelope[0] = zmq::message_t(producer.data(), producer.size());
    Reply(envelope, protocol::kFinished, protocol::EncodeFinished(ids, results));
  };
  // One FINISHED per kMaxMapEntries ids at most: its "results" map must decode (codec limits).
  for (auto& [producer, n] : by_producer) {
    if (n.ids.size() <= protocol::kMaxMapEntries) {  // the usual case: one notice
      send(producer, n.ids, n.results);
      continue;
    }
    for (size_t begin = 0; begin < n.ids.size(); begin += protocol::kMaxMapEntries) {
      const size_t end = std::min(n.ids.size(), begin + protocol::kMaxMapEntries);
      std::vector<std::string> ids(n.ids.begin() + begin, n.ids.begin() + end);
      protocol::InlineResults results;
      if (!n.results.empty()) {
        std::unordered_set<std::string_view> part(ids.begin(), ids.end());
        for (const auto& r : n.results)
          if (part.count(r.first) > 0) results.push_back(r);
      }
      send(producer, ids, results);
    }
  }
}

}  // namespace ferry::broker
