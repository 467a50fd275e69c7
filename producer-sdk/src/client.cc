#include "ferry/client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"
#include "frame_pool.h"
#include "io_thread.h"
#include "job_check.h"
#include "redis_store.h"
#include "result_deleter.h"
#include "result_tracker.h"

namespace ferry::client {
namespace {

using Clock = std::chrono::steady_clock;

// Whether the stored inputs of a job the broker rejected with `rejection` may still be read, so
// that the producer must leave them (they expire): a duplicate's keys are the pending job's (the
// same id), and a job rejected `unavailable` may already be on a worker (the broker dispatches
// before its journal write, whose failure rejects the job; protocol.md, "Stored inputs").
bool InputsMayBeRead(const Status& rejection) {
  return rejection.code() == codes::kDuplicate || rejection.code() == codes::kUnavailable;
}

// The reply to a request, decoded: ERROR becomes its status; anything but `expected` is a bug.
Status CheckReply(const IoThread::Reply& reply, std::string_view expected,
                  msgpack::object_handle* body) {
  FERRY_RETURN_IF_ERROR(protocol::UnpackMap(reply.body.data(), reply.body.size(), body));
  if (reply.command == protocol::kError) {
    Status error;
    FERRY_RETURN_IF_ERROR(protocol::DecodeError(body->get(), &error));
    return error.ok() ? Status::Internal("broker sent ERROR with an empty code") : error;
  }
  if (reply.command != expected) {
    return Status(codes::kMalformed, "broker answered " + reply.command + " where " +
                                         std::string(expected) + " was expected");
  }
  return Status::Ok();
}

// Client::Run's verdict from the broker's reply to its one-job SUBMIT (a reply comes only when
// the job was not accepted): the job's rejection, or an error.
Status RunVerdict(const IoThread::Reply& reply, const std::string& id) {
  msgpack::object_handle body;
  protocol::Accepted accepted;
  Status s = CheckReply(reply, protocol::kAccepted, &body);
  if (s.ok()) s = protocol::DecodeAccepted(body.get(), &accepted);
  // One job per SUBMIT: any rejection is its own (whatever id the broker could read); listed as
  // accepted (a broker that ignores "ack"), it is not one.
  if (s.ok() && !accepted.rejected.empty()) {
    s = Status(accepted.rejected[0].code, accepted.rejected[0].message);
  } else if (s.ok() &&
             std::find(accepted.ids.begin(), accepted.ids.end(), id) == accepted.ids.end()) {
    s = Status::Internal("the broker did not report on this job");
  }
  return s;
}

}  // namespace

class Client::Impl {
 public:
  // Result notices come straight from workers (ClientOptions::push_results) only for SUBMITs
  // made while fewer than this many of this client's jobs are tracked: at light load that saves
  // the DONE and FINISHED hops through the broker; under load batching amortizes them, and the
  // extra PUBLISH per job would only cost Redis CPU.
  static constexpr size_t kPushMaxTracked = 64;

  Impl(const ClientOptions& options, protocol::RedisEndpoint redis)
      : options_(options),
        redis_(std::move(redis)),
        keys_(options.redis_prefix),
        store_(redis_, options.redis_prefix, options.request_timeout_ms),
        tracker_(
            [this](const std::string& id, int timeout_ms, Result* out) {
              return store_.Read(id, out, options_.consume_results, timeout_ms);
            },
            // consume_results: a result that came inline (in a notice) is still in Redis;
            // delete it too, in the background (result_deleter.h).
            [this](const std::string& id) {
              if (options_.consume_results) deleter_.Add(id);
            }) {}

  Status Start() {
    IoThread::Options o;
    o.frontend = options_.frontend;
    o.curve_server_public = options_.curve_server_public;
    o.curve_secret = options_.curve_secret;
    o.push_results = options_.push_results;
    o.redis = redis_;
    o.redis_prefix = options_.redis_prefix;
    o.redis_timeout_ms = options_.request_timeout_ms;
    o.max_message_bytes = options_.max_message_bytes;
    o.on_finished = [this](const std::vector<std::string>& ids,
                           const protocol::InlineResults& records) {
      tracker_.Notify(ids, records);
    };
    // Notices published while a subscription was failing are gone, and the broker sends no
    // FINISHED for those jobs: their Waits read Redis now instead of at the slow re-check.
    o.on_push_lost = [this] { tracker_.RecheckOurs(); };
    return IoThread::Start(std::move(o), &io_);
  }

  // Jobs by pointer so that Submit(job) need not copy the job's tensors.
  Status SubmitMany(const std::vector<const Job*>& jobs, std::vector<SubmitOutcome>* outcomes);
  Status Wait(const std::string& id, int timeout_ms, Result* out) {
    return tracker_.Wait(id, timeout_ms, out);
  }
  Status Run(const Job& job, int timeout_ms, Result* out, std::string* id);
  Status Stats(std::string* json);
  Status Cancel(const std::vector<std::string>& ids, CancelReport* report);
  Status Poll(const std::string& id, Result* out) {
    if (!protocol::IsValidJobId(id))
      return Status::InvalidArgument("job id \"" + id + "\" is not a valid Ferry id");
    return store_.Read(id, out);
  }

 private:
  // The SUBMIT body for jobs[i], i in `part`, with ids from *outcomes; `ack` false asks the
  // broker to answer only rejections. Tracks the ids first (a result may come before any
  // reply).
  // Inputs that are neither stored nor small are attached: their bytes are copied once, into
  // *frames (one data frame each, in order), and the body names them.
  zmq::message_t EncodeSubmit(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                              const std::vector<SubmitOutcome>& outcomes, int64_t rid, bool ack,
                              std::vector<zmq::message_t>* frames);
  // The channel the next SUBMIT names ("" = none); `tracked` is how many of this client's jobs
  // the tracker held before the SUBMIT's own. Only at light load; the first such SUBMIT (and the
  // first after the subscription failed and its back-off passed) has the I/O thread subscribe
  // first, and waits for that (at most min(request_timeout_ms, 1 s)).
  std::string NotifyChannel(size_t tracked);
  // Whether input `t` goes to Redis rather than inside the SUBMIT
  // (ClientOptions::stored_input_bytes).
  bool Stored(const Tensor& t) const { return IsStored(t, options_.stored_input_bytes); }
  // Whether input `t` travels in a data frame of its own (ClientOptions::attached_input_bytes).
  bool Attached(const Tensor& t) const {
    return !Stored(t) && options_.attached_input_bytes > 0 &&
           t.data.size() >= static_cast<size_t>(options_.attached_input_bytes);
  }
  // The Redis keys of `job`'s stored inputs, appended to *keys.
  void AppendInputKeys(const Job& job, const std::string& id, std::vector<std::string>* keys) const;
  // Writes the stored inputs of jobs[i], i in `part` (one round trip), before their SUBMIT.
  Status StoreInputs(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                     const std::vector<SubmitOutcome>& outcomes);
  // Sends jobs[i] for i in `part` as one SUBMIT and records each verdict in *outcomes.
  Status SubmitOne(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                   std::vector<SubmitOutcome>* outcomes);

  const ClientOptions options_;
  const protocol::RedisEndpoint redis_;
  const protocol::Keys keys_;
  RedisStore store_;
  FramePool frames_;  // buffers of attached inputs' frames
  // After store_, which it uses; before tracker_, which calls it.
  ResultDeleter deleter_{&store_};
  // Before io_: the I/O thread calls into it until io_'s destructor has joined the thread.
  ResultTracker tracker_;
  std::unique_ptr<IoThread> io_;
};

Status Client::Impl::SubmitMany(const std::vector<const Job*>& jobs,
                                std::vector<SubmitOutcome>* outcomes) {
  outcomes->assign(jobs.size(), SubmitOutcome{});
  std::vector<size_t> sent;  // indexes of the jobs in the message
  std::unordered_set<std::string> seen;
  const int64_t max_job_bytes = io_->broker_max_job_bytes();
  for (size_t i = 0; i < jobs.size(); ++i) {
    SubmitOutcome& o = (*outcomes)[i];
    o.id = jobs[i]->id.empty() ? protocol::NewUuid() : jobs[i]->id;
    o.status = CheckJob(*jobs[i], o.id, options_, max_job_bytes);
    if (o.status.ok() && !seen.insert(o.id).second)
      o.status = Status(codes::kDuplicate, "id \"" + o.id + "\" appears twice in one call");
    if (o.status.ok()) sent.push_back(i);
  }
  if (sent.empty()) return Status::Ok();

  // One SUBMIT per kMaxSubmitBytes of tensor data (or max_message_bytes, or the broker's limit
  // from LIMITS, if less; a single bigger job goes alone) and per kMaxJobsPerMessage jobs (or
  // the broker's, if less): brokers refuse bigger messages (and drop peers that send a bigger
  // frame). Before the broker has answered LIMITS the configured limits stand: the I/O thread
  // then refuses a SUBMIT over the broker's (too_large) rather than sending it.
  size_t max_jobs = static_cast<size_t>(protocol::kMaxJobsPerMessage);
  size_t max_bytes = std::min(kMaxSubmitBytes, static_cast<size_t>(options_.max_message_bytes));
  if (const int64_t broker = io_->broker_max_message_bytes(); broker > 0)
    max_bytes = std::min(max_bytes, static_cast<size_t>(broker));
  if (const int64_t broker = io_->broker_max_jobs_per_message(); broker > 0)
    max_jobs = std::min(max_jobs, static_cast<size_t>(broker));
  size_t begin = 0;
  while (begin < sent.size()) {
    size_t end = begin, bytes = SubmitHeaderBytes(options_);
    while (end < sent.size() && end - begin < max_jobs) {
      const size_t job_bytes =
          SubmitBytes(*jobs[sent[end]], (*outcomes)[sent[end]].id, options_.stored_input_bytes);
      if (end > begin && bytes + job_bytes > max_bytes) break;
      bytes += job_bytes;
      ++end;
    }
    std::vector<size_t> part(sent.begin() + begin, sent.begin() + end);
    Status s = SubmitOne(jobs, part, outcomes);
    if (!s.ok()) {
      // The broker is not answering: do not send (and wait for) the rest.
      for (size_t k = end; k < sent.size(); ++k) (*outcomes)[sent[k]].status = s;
      return s;
    }
    begin = end;
  }
  return Status::Ok();
}

std::string Client::Impl::NotifyChannel(size_t tracked) {
  if (!options_.push_results || tracked >= kPushMaxTracked) return "";
  if (io_->subscribe_due()) io_->Subscribe(std::min(options_.request_timeout_ms, 1000));
  return io_->push_channel();
}

zmq::message_t Client::Impl::EncodeSubmit(const std::vector<const Job*>& jobs,
                                          const std::vector<size_t>& part,
                                          const std::vector<SubmitOutcome>& outcomes, int64_t rid,
                                          bool ack, std::vector<zmq::message_t>* frames) {
  // Track before sending: the FINISHED notice may come before this thread sees ACCEPTED. And
  // before the notify channel is read: should the I/O thread see the subscription fail in
  // between, its recheck then covers these ids too.
  std::vector<std::string> ids;
  ids.reserve(part.size());
  for (size_t i : part) ids.push_back(outcomes[i].id);
  const size_t tracked = tracker_.Entries();
  tracker_.Track(ids);
  const std::string notify = NotifyChannel(tracked);

  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(3 + (notify.empty() ? 0 : 1) + (ack ? 0 : 1));
  if (!notify.empty()) {  // results also come straight from the worker, through Redis Pub/Sub
    protocol::PackString(pk, "notify");
    protocol::PackString(pk, notify);
  }
  if (!ack) {
    protocol::PackString(pk, "ack");
    pk.pack_false();
  }
  // Small results come back inside FINISHED: Wait then needs no Redis read for them.
  protocol::PackString(pk, "inline_results");
  pk.pack_true();
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(part.size()));
  for (size_t i : part) {
    const Job& j = *jobs[i];
    std::vector<bool> stored(j.inputs.size()), attached(j.inputs.size());
    for (size_t k = 0; k < j.inputs.size(); ++k) {
      stored[k] = Stored(j.inputs[k]);
      attached[k] = Attached(j.inputs[k]);
      if (attached[k])
        frames->push_back(frames_.Copy(j.inputs[k].data.data(), j.inputs[k].data.size()));
    }
    protocol::PackSubmitJob(pk, outcomes[i].id, j.model, j.inputs, j.priority, j.timeout_ms,
                            j.result_ttl_s, stored, attached);
  }
  protocol::PackString(pk, "rid");
  pk.pack_int64(rid);
  return protocol::ToMessage(std::move(buf));
}

Status Client::Impl::SubmitOne(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                               std::vector<SubmitOutcome>* outcomes) {
  // Big inputs go to Redis first: once the broker has the job, a worker may read them.
  Status stored = StoreInputs(jobs, part, *outcomes);
  if (!stored.ok()) {
    for (size_t i : part) (*outcomes)[i].status = stored;
    return stored;
  }
  const int64_t rid = io_->NextRid();
  std::vector<std::string> ids;
  ids.reserve(part.size());
  for (size_t i : part) ids.push_back((*outcomes)[i].id);
  std::vector<zmq::message_t> frames;
  zmq::message_t message = EncodeSubmit(jobs, part, *outcomes, rid, /*ack=*/true, &frames);

  IoThread::Reply reply;
  msgpack::object_handle body;
  protocol::Accepted accepted;
  bool unsent = false;
  Status s = io_->Call(rid, protocol::kSubmit, std::move(message), options_.request_timeout_ms,
                       &reply, std::move(frames), &unsent);
  if (s.ok()) s = CheckReply(reply, protocol::kAccepted, &body);
  if (s.ok()) s = protocol::DecodeAccepted(body.get(), &accepted);
  if (!s.ok()) {
    for (size_t i : part) (*outcomes)[i].status = s;
    tracker_.Untrack(ids);  // maybe accepted: Wait then reads before sleeping
    // Never sent (and never will be), or refused whole (too_large: by the broker, or over its
    // limit before sending): nobody reads its stored inputs.
    if (unsent || s.code() == codes::kTooLarge) {
      std::vector<std::string> keys;
      for (size_t i : part) AppendInputKeys(*jobs[i], (*outcomes)[i].id, &keys);
      if (!keys.empty()) (void)store_.Delete(keys);  // else they expire
    }
    return s;
  }
  std::unordered_map<std::string_view, Status> verdicts;
  for (const auto& id : accepted.ids) verdicts.emplace(id, Status::Ok());
  for (const auto& r : accepted.rejected) verdicts[r.id] = Status(r.code, r.message);
  std::vector<std::string> not_accepted;
  std::vector<std::string> unused_inputs;  // stored for jobs the broker did not take
  for (size_t i : part) {
    auto it = verdicts.find((*outcomes)[i].id);
    (*outcomes)[i].status = it != verdicts.end()
                                ? it->second
                                : Status::Internal("the broker did not report on this job");
    const Status& v = (*outcomes)[i].status;
    if (v.ok()) continue;
    not_accepted.push_back((*outcomes)[i].id);
    if (InputsMayBeRead(v)) continue;
    AppendInputKeys(*jobs[i], (*outcomes)[i].id, &unused_inputs);
  }
  if (!not_accepted.empty()) tracker_.Untrack(not_accepted);
  if (!unused_inputs.empty()) (void)store_.Delete(unused_inputs);  // else they expire
  return Status::Ok();
}

void Client::Impl::AppendInputKeys(const Job& job, const std::string& id,
                                   std::vector<std::string>* keys) const {
  for (size_t k = 0; k < job.inputs.size(); ++k)
    if (Stored(job.inputs[k])) keys->push_back(keys_.Input(id, k));
}

Status Client::Impl::StoreInputs(const std::vector<const Job*>& jobs,
                                 const std::vector<size_t>& part,
                                 const std::vector<SubmitOutcome>& outcomes) {
  std::vector<std::string> keys;
  std::vector<std::string_view> values;
  for (size_t i : part) {
    const Job& j = *jobs[i];
    for (size_t k = 0; k < j.inputs.size(); ++k) {
      if (!Stored(j.inputs[k])) continue;
      keys.push_back(keys_.Input(outcomes[i].id, k));
      values.emplace_back(j.inputs[k].data);
    }
  }
  Status s = store_.PutInputs(keys, values, options_.input_ttl_s);
  if (!s.ok()) return Status(s.code(), "storing big inputs in Redis: " + s.message());
  return Status::Ok();
}

Status Client::Impl::Run(const Job& job, int timeout_ms, Result* out, std::string* id_out) {
  std::vector<SubmitOutcome> outcome(1);
  outcome[0].id = job.id.empty() ? protocol::NewUuid() : job.id;
  if (id_out) *id_out = outcome[0].id;
  const std::string id = outcome[0].id;
  *out = Result();
  out->id = id;
  FERRY_RETURN_IF_ERROR(CheckJob(job, id, options_, io_->broker_max_job_bytes()));
  if (timeout_ms == 0)
    return Status::InvalidArgument("Run needs a timeout (or -1: none); to check once, use Poll");
  // A Run again after a timeout whose result has come since: nothing to send.
  if (tracker_.Finished(id)) return tracker_.Wait(id, timeout_ms, out);

  FERRY_RETURN_IF_ERROR(StoreInputs({&job}, {0}, outcome));
  const int64_t rid = io_->NextRid();
  std::vector<zmq::message_t> frames;
  zmq::message_t message = EncodeSubmit({&job}, {0}, outcome, rid, /*ack=*/false, &frames);
  // A reply comes only when the job was not accepted (or the SUBMIT was refused as a whole): it
  // is this call's verdict, not the id's (another submission of the id may be accepted). The
  // handler runs on the I/O thread, possibly after this call returned: hence the shared verdict.
  auto verdict = std::make_shared<ResultTracker::Verdict>();
  auto request = io_->Post(
      rid, protocol::kSubmit, std::move(message),
      [this, id, verdict](IoThread::Reply reply) {
        Status s;
        try {
          s = RunVerdict(reply, id);
        } catch (const std::exception& e) {  // e.g. std::bad_alloc: a lost rejection would
          s = Status::Internal(std::string("reading the broker's reply: ") + e.what());
        }  // leave this Run waiting until its timeout
        // A duplicate is pending already: its result is this job's result.
        if (!s.ok() && s.code() != codes::kDuplicate) tracker_.Reject(id, verdict.get(), s);
      },
      std::move(frames));
  Status s;
  try {
    s = tracker_.Wait(id, timeout_ms, out, verdict.get());
  } catch (...) {
    io_->Forget(request);
    throw;
  }
  const bool unsent = io_->Forget(request);  // dropped if still queued: never sent late
  if (s.ok() || s.code() == codes::kTimeout) {
    if (!unsent || s.ok()) return s;  // a timeout with the job sent: the caller may Run again
  }
  tracker_.Untrack({id});  // no result of ours to expect: not sent, rejected, or no Redis
  Status rejection;
  if (unsent || (tracker_.Rejected(*verdict, &rejection) && !InputsMayBeRead(rejection))) {
    std::vector<std::string> keys;
    AppendInputKeys(job, id, &keys);
    if (!keys.empty()) (void)store_.Delete(keys);  // else they expire
  }
  if (unsent) {
    const std::string why = io_->handshake_error();
    return Status::Unavailable("no broker at " + options_.frontend + " took the job within " +
                               std::to_string(timeout_ms) + " ms (" +
                               (why.empty() ? "is ferry-broker running and reachable?" : why) +
                               "); it was not sent");
  }
  return s;
}

Status Client::Impl::Stats(std::string* json) {
  int64_t rid = io_->NextRid();
  IoThread::Reply reply;
  FERRY_RETURN_IF_ERROR(io_->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid),
                                  options_.request_timeout_ms, &reply));
  msgpack::object_handle body;
  FERRY_RETURN_IF_ERROR(CheckReply(reply, protocol::kStats, &body));
  // Everything but our "rid".
  const msgpack::object& map = body.get();
  std::vector<msgpack::object_kv> kept;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    if (protocol::AsStringView(map.via.map.ptr[i].key) != "rid") kept.push_back(map.via.map.ptr[i]);
  }
  msgpack::object filtered;
  filtered.type = msgpack::type::MAP;
  filtered.via.map.size = static_cast<uint32_t>(kept.size());
  filtered.via.map.ptr = kept.data();
  *json = protocol::ToJson(filtered);
  return Status::Ok();
}

Status Client::Impl::Cancel(const std::vector<std::string>& ids, CancelReport* report) {
  *report = CancelReport();
  for (const auto& id : ids) {
    if (!protocol::IsValidJobId(id))
      return Status::InvalidArgument("job id \"" + id + "\" is not a valid Ferry id");
  }
  // One CANCEL per kMaxJobsPerMessage ids: the broker refuses a bigger one whole.
  const size_t max_ids = static_cast<size_t>(protocol::kMaxJobsPerMessage);
  auto append = [](std::vector<std::string>* to, std::vector<std::string>* from) {
    to->insert(to->end(), std::make_move_iterator(from->begin()),
               std::make_move_iterator(from->end()));
  };
  for (size_t begin = 0; begin < ids.size(); begin += max_ids) {
    std::vector<std::string> part(ids.begin() + begin,
                                  ids.begin() + std::min(ids.size(), begin + max_ids));
    int64_t rid = io_->NextRid();
    IoThread::Reply reply;
    FERRY_RETURN_IF_ERROR(io_->Call(rid, protocol::kCancel, protocol::EncodeIds(part, rid),
                                    options_.request_timeout_ms, &reply));
    msgpack::object_handle body;
    FERRY_RETURN_IF_ERROR(CheckReply(reply, protocol::kCancelled, &body));
    protocol::Cancelled c;
    FERRY_RETURN_IF_ERROR(protocol::DecodeCancelled(body.get(), &c));
    append(&report->cancelled, &c.ids);
    append(&report->running, &c.running);
    append(&report->not_found, &c.not_found);
  }
  return Status::Ok();
}

// ---- Client: forwarding; no exception leaves the SDK -------------------------------------------

namespace {
// Runs `fn`, turning an exception (std::bad_alloc, a library's) into an internal Status: every
// Client method returns a Status and nothing throws (client.h).
template <typename Fn>
Status Guarded(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Status::Internal(std::string(what) + ": " + e.what());
  } catch (...) {
    return Status::Internal(std::string(what) + ": unknown exception");
  }
}
}  // namespace

namespace {
// $name when set and not empty.
bool FromEnv(const char* name, std::string* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  *out = v;
  return true;
}
}  // namespace

ClientOptions ClientOptions::FromEnvironment() {
  ClientOptions o;
  FromEnv("FERRY_FRONTEND", &o.frontend);
  FromEnv("FERRY_REDIS", &o.redis);
  FromEnv("FERRY_REDIS_PREFIX", &o.redis_prefix);
  FromEnv("FERRY_CURVE_SERVER_PUBLIC", &o.curve_server_public);
  FromEnv("FERRY_CURVE_SECRET", &o.curve_secret);
  if (std::string limit; FromEnv("FERRY_MAX_MESSAGE_BYTES", &limit)) {
    char* end = nullptr;
    const long long v = std::strtoll(limit.c_str(), &end, 10);
    o.max_message_bytes = *end == '\0' ? v : 0;  // not a number: Create refuses 0, naming it
  }
  // As the Python client: the Redis files only where they apply to this URL, so that a plain
  // redis:// URL still works in a shell that sourced a TLS fleet's env file.
  const bool tls = o.redis.rfind("rediss://", 0) == 0;
  const size_t scheme_end = o.redis.find("://");
  const size_t at = o.redis.find('@');
  const bool has_password = scheme_end != std::string::npos && at != std::string::npos &&
                            o.redis.find(':', scheme_end + 3) < at;
  if (!has_password) FromEnv("FERRY_REDIS_PASSWORD_FILE", &o.redis_password_file);
  if (tls) {
    FromEnv("FERRY_REDIS_TLS_CA", &o.redis_tls_ca);
    FromEnv("FERRY_REDIS_TLS_CERT", &o.redis_tls_cert);
    FromEnv("FERRY_REDIS_TLS_KEY", &o.redis_tls_key);
  }
  return o;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Create(const ClientOptions& options, std::unique_ptr<Client>* out) {
  return Guarded("Create", [&] {
    protocol::RedisEndpoint redis;
    FERRY_RETURN_IF_ERROR(
        protocol::ResolveRedisEndpoint(options.redis,
                                       {options.redis_password_file, options.redis_tls_ca,
                                        options.redis_tls_cert, options.redis_tls_key},
                                       &redis));
    if (options.request_timeout_ms <= 0)
      return Status::InvalidArgument("request_timeout_ms must be > 0");
    if (options.stored_input_bytes < 0)
      return Status::InvalidArgument("stored_input_bytes must be >= 0 (0: none)");
    if (options.attached_input_bytes < 0)
      return Status::InvalidArgument("attached_input_bytes must be >= 0 (0: none)");
    if (options.max_message_bytes < 1024)
      return Status::InvalidArgument("max_message_bytes must be >= 1024 (the broker's minimum)");
    if (options.input_ttl_s <= 0 || options.input_ttl_s > 30 * 24 * 3600)
      return Status::InvalidArgument("input_ttl_s must be 1 s to 30 days");
    auto impl = std::make_unique<Impl>(options, std::move(redis));
    FERRY_RETURN_IF_ERROR(impl->Start());
    out->reset(new Client(std::move(impl)));
    return Status::Ok();
  });
}

Status Client::Submit(const Job& job, std::string* id) {
  return Guarded("Submit", [&] {
    std::vector<SubmitOutcome> outcomes;
    Status s = impl_->SubmitMany({&job}, &outcomes);
    if (id) *id = outcomes.at(0).id;
    return s.ok() ? outcomes[0].status : s;
  });
}

Status Client::SubmitMany(const std::vector<Job>& jobs, std::vector<SubmitOutcome>* outcomes) {
  return Guarded("SubmitMany", [&] {
    std::vector<const Job*> ptrs;
    ptrs.reserve(jobs.size());
    for (const Job& j : jobs) ptrs.push_back(&j);
    return impl_->SubmitMany(ptrs, outcomes);
  });
}

Status Client::Run(const Job& job, int timeout_ms, Result* out, std::string* id) {
  return Guarded("Run", [&] { return impl_->Run(job, timeout_ms, out, id); });
}

Status Client::Poll(const std::string& id, Result* out) {
  return Guarded("Poll", [&] { return impl_->Poll(id, out); });
}

Status Client::Wait(const std::string& id, int timeout_ms, Result* out) {
  return Guarded("Wait", [&] {
    if (!protocol::IsValidJobId(id))
      return Status::InvalidArgument("job id \"" + id + "\" is not a valid Ferry id");
    return impl_->Wait(id, timeout_ms, out);
  });
}

Status Client::Stats(std::string* json) {
  return Guarded("Stats", [&] { return impl_->Stats(json); });
}

Status Client::CancelMany(const std::vector<std::string>& ids, CancelReport* report) {
  return Guarded("CancelMany", [&] { return impl_->Cancel(ids, report); });
}

Status Client::Cancel(const std::string& id) {
  return Guarded("Cancel", [&] {
    CancelReport report;
    FERRY_RETURN_IF_ERROR(impl_->Cancel({id}, &report));
    if (report.cancelled.empty() && report.running.empty())
      return Status::NotFound("job \"" + id + "\" is not pending at the broker");
    return Status::Ok();
  });
}

}  // namespace ferry::client
