// The submit path of Client::Impl (client_impl.h): SubmitMany and Run, their jobs' big inputs
// stored in Redis before the SUBMIT, the SUBMIT encoded, and the broker's verdicts read.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "client_impl.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {
namespace {

// The least time a Run gives the DEL of its stored inputs when its job was never sent.
constexpr int64_t kCleanupMs = 100;

// Whether the stored inputs of a job the broker rejected with `rejection` may still be read, so
// that the producer must leave them (they expire): a duplicate's keys are the pending job's (the
// same id), and a job rejected `unavailable` may already be on a worker (the broker dispatches
// before its journal write, whose failure rejects the job; protocol.md, "Stored inputs").
bool InputsMayBeRead(const Status& rejection) {
  return rejection.code() == codes::kDuplicate || rejection.code() == codes::kUnavailable;
}

// Client::Run's verdict from the broker's reply to its one-job SUBMIT (a reply comes only when
// the job was not accepted): the job's rejection, or an error (*whole: the SUBMIT was refused as
// a whole, or its answer was not read; the broker did not look at the job).
Status RunVerdict(const IoThread::Reply& reply, const std::string& id, bool* whole) {
  msgpack::object_handle body;
  protocol::Accepted accepted;
  Status s = CheckReply(reply, protocol::kAccepted, &body);
  if (s.ok()) s = protocol::DecodeAccepted(body.get(), &accepted);
  *whole = !s.ok();
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
  // frame). Before the broker has answered LIMITS the configured limits stand, and a SUBMIT over
  // the broker's is refused whole (too_large: by the I/O thread before sending, or by the
  // broker): SendInParts splits its jobs again under the limits now known. A single job over
  // the broker's message limit is refused alone (its outcome says why); the rest go.
  auto job_bytes = [&](size_t k) {
    return SubmitBytes(*jobs[sent[k]], (*outcomes)[sent[k]].id, options_.stored_input_bytes);
  };
  auto send = [&](size_t begin, size_t end) -> Status {
    Status s =
        SubmitOne(jobs, std::vector<size_t>(sent.begin() + begin, sent.begin() + end), outcomes);
    return s.code() == codes::kTooLarge && end - begin == 1 ? Status::Ok() : s;
  };
  size_t stopped_at = 0;
  Status s = SendInParts(sent.size(), SubmitHeaderBytes(options_), job_bytes, send, &stopped_at);
  // The broker is not answering (or refused a SUBMIT whole under limits already known): the
  // rest is not sent (nor waited for).
  for (size_t k = stopped_at; k < sent.size(); ++k) (*outcomes)[sent[k]].status = s;
  return s;
}

Status Client::Impl::SendInParts(size_t count, size_t header_bytes,
                                 const std::function<size_t(size_t)>& item_bytes,
                                 const std::function<Status(size_t, size_t)>& send,
                                 size_t* stopped_at) {
  int splits_again = 0;
  size_t begin = 0;
  while (begin < count) {
    const auto limits = MessageLimits();
    const auto [max_bytes, max_items] = limits;
    size_t end = begin, bytes = header_bytes;
    while (end < count && end - begin < max_items) {
      const size_t b = item_bytes(end);
      if (end > begin && bytes + b > max_bytes) break;
      bytes += b;
      ++end;
    }
    Status s = send(begin, end);
    if (s.code() == codes::kTooLarge && end - begin > 1 && MessageLimits() != limits &&
        splits_again++ < 3)
      continue;  // split under the limits learned meanwhile
    if (!s.ok()) {
      *stopped_at = end;
      return s;
    }
    begin = end;
  }
  *stopped_at = count;
  return Status::Ok();
}

std::pair<size_t, size_t> Client::Impl::MessageLimits() const {
  size_t max_bytes = std::min(kMaxSubmitBytes, static_cast<size_t>(options_.max_message_bytes));
  size_t max_jobs = static_cast<size_t>(protocol::kMaxJobsPerMessage);
  if (const int64_t broker = io_->broker_max_message_bytes(); broker > 0)
    max_bytes = std::min(max_bytes, static_cast<size_t>(broker));
  if (const int64_t broker = io_->broker_max_jobs_per_message(); broker > 0)
    max_jobs = std::min(max_jobs, static_cast<size_t>(broker));
  return {max_bytes, max_jobs};
}

std::string Client::Impl::NotifyChannel(size_t tracked) {
  if (!options_.push_results || tracked > kPushMaxTracked) return "";
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
  tracker_.Track(ids);
  const std::string notify = NotifyChannel(tracker_.Entries());

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
    return stored;  // StoreInputs deleted what it wrote: the SUBMIT is never sent
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
  // An ERROR: the broker (or this client, for too_large) refused the SUBMIT as a whole.
  const bool refused_whole = s.ok() && reply.command == protocol::kError;
  if (s.ok()) s = CheckReply(reply, protocol::kAccepted, &body);
  if (s.ok()) s = protocol::DecodeAccepted(body.get(), &accepted);
  if (!s.ok()) {
    for (size_t i : part) (*outcomes)[i].status = s;
    tracker_.Untrack(ids);  // maybe accepted: Wait then reads before sleeping
    // Never sent (and never will be), or refused whole (an ERROR: too_large by the broker or
    // over its limit before sending, malformed, invalid_argument): nobody reads its stored
    // inputs -- those of jobs whose id the SDK made (OwnId). The broker did not look at the
    // jobs: a caller's id may be a pending job's.
    if (unsent || refused_whole) {
      std::vector<std::string> keys;
      for (size_t i : part)
        if (OwnId(*jobs[i])) AppendInputKeys(*jobs[i], (*outcomes)[i].id, &keys);
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
                                 const std::vector<SubmitOutcome>& outcomes, int timeout_ms) {
  std::vector<std::string> keys, own_keys;
  std::vector<std::string_view> values;
  for (size_t i : part) {
    const Job& j = *jobs[i];
    for (size_t k = 0; k < j.inputs.size(); ++k) {
      if (!Stored(j.inputs[k])) continue;
      keys.push_back(keys_.Input(outcomes[i].id, k));
      values.emplace_back(j.inputs[k].data);
      if (OwnId(j)) own_keys.push_back(keys.back());
    }
  }
  const int64_t start_us = protocol::MonotonicMicros();
  Status s = store_.PutInputs(keys, values, options_.input_ttl_s, timeout_ms);
  if (s.ok()) return Status::Ok();
  // Some SETs may have gone through (Redis at maxmemory takes the first ones, then answers OOM;
  // a timeout may come after all of them): the SUBMIT is not sent, so nobody reads them (those of
  // jobs with ids the SDK made: OwnId). Within what is left of `timeout_ms`, if any.
  const int64_t left =
      timeout_ms > 0 ? timeout_ms - (protocol::MonotonicMicros() - start_us) / 1000 : 0;
  if (!own_keys.empty() && (timeout_ms <= 0 || left > 0))
    (void)store_.Delete(own_keys, static_cast<int>(left));  // else they expire
  return Status(s.code(), "storing big inputs in Redis: " + s.message());
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

  // One deadline for the whole call: storing the inputs (a stalled Redis) spends it too.
  const int64_t start_us = protocol::MonotonicMicros();
  const int requested_ms = timeout_ms;
  FERRY_RETURN_IF_ERROR(StoreInputs({&job}, {0}, outcome, std::max(timeout_ms, 0)));
  if (timeout_ms > 0) {
    const int64_t spent_ms = (protocol::MonotonicMicros() - start_us) / 1000;
    timeout_ms = static_cast<int>(std::max<int64_t>(1, timeout_ms - spent_ms));
  }
  const int64_t rid = io_->NextRid();
  std::vector<zmq::message_t> frames;
  zmq::message_t message = EncodeSubmit({&job}, {0}, outcome, rid, /*ack=*/false, &frames);
  // A reply comes only when the job was not accepted (or the SUBMIT was refused as a whole): it
  // is this call's verdict, not the id's (another submission of the id may be accepted). The
  // handler runs on the I/O thread, possibly after this call returned: hence the shared verdict.
  auto verdict = std::make_shared<ResultTracker::Verdict>();
  // Set before the verdict, which the tracker publishes under its lock.
  auto refused_whole = std::make_shared<std::atomic<bool>>(false);
  auto request = io_->Post(
      rid, protocol::kSubmit, std::move(message),
      [this, id, verdict, refused_whole](IoThread::Reply reply) {
        Status s;
        bool whole = true;
        try {
          s = RunVerdict(reply, id, &whole);
        } catch (const std::exception& e) {  // e.g. std::bad_alloc: a lost rejection would
          s = Status::Internal(std::string("reading the broker's reply: ") + e.what());
        }  // leave this Run waiting until its timeout
        // A duplicate is pending already: its result is this job's result.
        if (!s.ok() && s.code() != codes::kDuplicate) {
          refused_whole->store(whole);
          tracker_.Reject(id, verdict.get(), s);
        }
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
  // The stored inputs are nobody's: never sent (under an id the SDK made), or rejected -- but a
  // SUBMIT refused as a whole only under an id the SDK made: the broker did not look at the
  // job, and a caller's id may be a pending job's (a retry), whose inputs those keys are.
  Status rejection;
  if ((unsent && OwnId(job)) ||
      (tracker_.Rejected(*verdict, &rejection) && !InputsMayBeRead(rejection) &&
       (OwnId(job) || !refused_whole->load()))) {
    std::vector<std::string> keys;
    AppendInputKeys(job, id, &keys);
    // Within what is left of the call's timeout, but at least kCleanupMs: a job never sent is
    // known only at the deadline. A stalled Redis holds the call that much longer at most (a
    // DEL it does not take leaves the keys to expire).
    const int64_t left_ms =
        requested_ms > 0 ? requested_ms - (protocol::MonotonicMicros() - start_us) / 1000 : 0;
    if (!keys.empty())
      (void)store_.Delete(keys,
                          requested_ms > 0 ? static_cast<int>(std::max(left_ms, kCleanupMs)) : 0);
  }
  if (unsent) {
    const std::string why = io_->handshake_error();
    return Status::Unavailable("no broker at " + options_.frontend + " took the job within " +
                               std::to_string(requested_ms) + " ms (" +
                               (why.empty() ? "is ferry-broker running and reachable?" : why) +
                               "); it was not sent");
  }
  return s;
}

}  // namespace ferry::client
