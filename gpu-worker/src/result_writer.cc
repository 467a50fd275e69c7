#include "result_writer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <new>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis_errors.h"
#include "ferry/runtime/thread_name.h"
#include "worker_metrics.h"

namespace ferry::worker {
namespace {

// SET NX, and when it stored the record, PUBLISH the result notice on the producer's channel --
// atomically, so a notice always follows the write it announces and a losing duplicate is never
// announced. Replies as SET NX does: OK when stored, nil when another result was there first.
//   KEYS[1] result key; ARGV: record, ttl seconds, channel, notice
constexpr std::string_view kSetAndPublish =
    "local ok = redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2], 'NX') "
    "if ok then redis.call('PUBLISH', ARGV[3], ARGV[4]) end "
    "return ok";

bool IsPowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The result's "status" for a job's final Status.
std::string_view ResultStatus(const Status& s) {
  if (s.ok()) return "done";
  if (s.code() == codes::kCancelled) return "cancelled";
  if (s.code() == codes::kExpired) return "expired";
  return "failed";
}

}  // namespace

ResultWriter::ResultWriter(Options options, Outbox* outbox)
    : options_(std::move(options)), keys_(options_.prefix), outbox_(outbox) {}

ResultWriter::~ResultWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    aborted_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!queue_.empty())
    spdlog::error("result writer: {} results abandoned unwritten", queue_.size());
}

void ResultWriter::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ResultWriter::Submit(std::vector<JobResult> results) {
  if (results.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : results) queue_.push_back(std::move(r));
  }
  cv_.notify_one();
}

void ResultWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t ResultWriter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + in_flight_;
}

int64_t ResultWriter::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

int64_t ResultWriter::duplicates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return duplicates_;
}

bool ResultWriter::Backoff(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return aborted_; });
}

void ResultWriter::Loop() {
  runtime::NameThisThread("ferry-results");
  // Connect early so that a wrong --redis shows in the log at start; writes retry anyway.
  Status s = protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_);
  if (!s.ok()) spdlog::warn("result writer: {}; will retry when there are results", s.message());
  while (true) {
    std::vector<JobResult> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (aborted_ || queue_.empty()) break;
      batch.swap(queue_);
      in_flight_ = batch.size();
    }
    std::vector<PackedResult> packed = Pack(&batch);
    const bool written = WriteWithRetries(&packed);
    if (written) {
      OweInputDeletes(packed);
      Report(&batch, &packed);
    }
    bool idle = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ = 0;
      idle = queue_.empty();
    }
    if (!written) {
      spdlog::error("result writer: aborted with {} results unwritten", batch.size());
      break;
    }
    // Under load the owed DELs ride with the next batch's writes; idle, they go now.
    if (idle && !owed_deletes_.empty()) {
      std::vector<PackedResult> none;
      (void)WriteOnce(&none);  // on failure they stay owed
    }
  }
}

void ResultWriter::OweInputDeletes(const std::vector<PackedResult>& packed) {
  // A job's stored inputs go once its final result is in Redis (decided: stored, or another
  // final result found there), never beside the write: Redis at maxmemory refuses the SET (OOM)
  // but takes a DEL, and a worker that died then would leave the job with neither.
  for (const PackedResult& p : packed)
    if (p.decided)
      owed_deletes_.insert(owed_deletes_.end(), p.stored_inputs.begin(), p.stored_inputs.end());
  if (owed_deletes_.size() > kMaxOwedDeletes) {  // Redis refuses DELs, takes writes: they expire
    const size_t dropped = owed_deletes_.size() - kMaxOwedDeletes;
    owed_deletes_.erase(owed_deletes_.begin(), owed_deletes_.begin() + dropped);
    spdlog::warn("result writer: {} stored inputs left to expire (their DELs failed)", dropped);
  }
}

std::vector<ResultWriter::PackedResult> ResultWriter::Pack(std::vector<JobResult>* results) const {
  // Pack once; the outputs' memory (the batch tensors) is released right after.
  std::vector<PackedResult> packed;
  packed.reserve(results->size());
  const int64_t finished = protocol::NowMicros();
  for (JobResult& r : *results) {
    const protocol::ChunkJob& e = r.job.entry;
    if (r.status.ok()) {
      size_t bytes = 0;
      for (const auto& t : r.outputs) bytes += t.size;
      // Redis would drop the connection on such a record, which would look like Redis down and
      // hold every other result behind a retry that never succeeds.
      if (bytes > protocol::kMaxValueDataBytes)
        r.status = Status(codes::kTooLarge, "the model's outputs are " + std::to_string(bytes) +
                                                " bytes; a result record holds at most " +
                                                std::to_string(protocol::kMaxValueDataBytes) +
                                                " (Redis's largest value is 512 MiB)");
    }
    protocol::ResultRecord rec;
    rec.id = e.id;
    rec.status = ResultStatus(r.status);
    rec.model = e.model;
    rec.worker = options_.worker_name;
    if (r.status.ok()) {
      rec.outputs = r.outputs;
    } else {
      rec.error_code = r.status.code();
      rec.error_message = r.status.message();
    }
    rec.batch_size = r.batch_size;
    rec.attempt = e.attempt;
    rec.timing_us = {{"submitted", e.submitted_us},
                     {"dispatched", e.dispatched_us},
                     {"received", r.job.received_us},
                     {"finished", finished}};
    if (r.compute_start_us != 0) {
      rec.timing_us["compute_start"] = r.compute_start_us;
      rec.timing_us["compute_end"] = r.compute_end_us;
    }
    size_t size = 512 + rec.id.size() + rec.model.size() + rec.worker.size();
    for (const auto& t : rec.outputs) size += t.size + 16 * t.shape.size() + 64;
    msgpack::sbuffer buf;
    try {
      msgpack::sbuffer sized(size);  // sized up front: no regrowth copies of the output bytes
      protocol::Packer pk(sized);
      protocol::PackResult(pk, rec);
      buf = std::move(sized);
    } catch (const std::bad_alloc&) {  // the job fails; the writer goes on
      r.status =
          Status::Internal("no memory for the result record (" + std::to_string(size) + " bytes)");
      rec.status = ResultStatus(r.status);
      rec.outputs.clear();
      rec.error_code = r.status.code();
      rec.error_message = r.status.message();
      protocol::Packer pk(buf);
      protocol::PackResult(pk, rec);
    }
    const int64_t ttl = std::min(e.result_ttl_s > 0 ? e.result_ttl_s : options_.default_ttl_s,
                                 protocol::kMaxExpirySeconds);
    PackedResult p;
    p.key = keys_.Result(e.id);
    p.id = e.id;
    p.model = e.model;
    p.attempt = e.attempt;
    p.batch_size = r.batch_size;
    for (int32_t i : e.stored_inputs) p.stored_inputs.push_back(keys_.Input(e.id, i));
    p.record = std::move(buf);
    p.ttl = std::to_string(ttl);
    if (!e.notify.empty()) {
      // The notice is a FINISHED body for this one job, the record inside when small enough.
      protocol::InlineResults inline_record;
      p.scripted = p.record.size() <= options_.inline_result_bytes;
      if (p.scripted) inline_record.emplace_back(e.id, p.value());
      const zmq::message_t notice = protocol::EncodeFinished({e.id}, inline_record);
      p.notify = e.notify;
      p.notice.assign(static_cast<const char*>(notice.data()), notice.size());
    }
    packed.push_back(std::move(p));
    r.outputs.clear();
    r.outputs_owner.reset();
  }
  return packed;
}

Status ResultWriter::WriteOnce(std::vector<PackedResult>* packed) {
  // Connected before anything is queued: a round that fails here sent nothing.
  if (!client_) {
    FERRY_RETURN_IF_ERROR(
        protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_));
  }
  FERRY_RETURN_IF_ERROR(client_->EnsureConnected());
  // Per command sent, whose and what. A retry sends a record only what it still lacks: the
  // write (until it is decided), the notice of a big record stored without it.
  enum class Kind { kWrite, kScript, kPublish, kDelete };
  struct Sent {
    size_t record;  // (none for kDelete)
    Kind kind;
  };
  const bool scripts = scripts_ok_;
  std::vector<Sent> sent;
  // First the DEL of the stored inputs of results already in Redis (OweInputDeletes).
  const size_t owed = owed_deletes_.size();
  if (owed > 0) {
    std::vector<std::string_view> argv{"DEL"};
    argv.insert(argv.end(), owed_deletes_.begin(), owed_deletes_.end());
    client_->Append(argv);
    sent.push_back({0, Kind::kDelete});
  }
  for (size_t i = 0; i < packed->size(); ++i) {
    PackedResult& p = (*packed)[i];
    if (!scripts) p.notify.clear();  // plain writes; the broker's FINISHED tells the producer
    const bool first_try = !p.tried;
    if (!p.decided) p.tried = true;
    // By reference: the records (kept in `packed` until the write is done) are not copied.
    if (!p.decided && (p.notify.empty() || !p.scripted)) {
      client_->AppendByRef({"SET", p.key, p.value(), "EX", p.ttl, "NX"});
      sent.push_back({i, Kind::kWrite});
    } else if (!p.decided) {
      client_->AppendByRef(
          {"EVAL", kSetAndPublish, "1", p.key, p.value(), p.ttl, p.notify, p.notice});
      sent.push_back({i, Kind::kScript});
    }
    // A big record's notice goes right behind its write the first time (it reaches Redis even
    // when the write is refused: then before the record); after that, only once it is stored.
    if (!p.notify.empty() && !p.scripted && !p.notice_published && (p.stored || first_try)) {
      client_->Append({"PUBLISH", p.notify, p.notice});
      sent.push_back({i, Kind::kPublish});
    }
  }
  // On a connection that broke while the replies were read, `replies` holds those read before.
  std::vector<protocol::RedisReply> replies;
  Status s = client_->Flush(&replies);
  size_t answered = std::min(replies.size(), sent.size());
  if (s.ok() && replies.size() != sent.size()) {
    s = Status::Internal("redis answered " + std::to_string(replies.size()) + " of " +
                         std::to_string(sent.size()) + " commands");
    answered = 0;  // not known to match what was sent: no answer counts
  }
  for (size_t k = answered; k < sent.size(); ++k) {  // no answer: it may have got through
    if (sent[k].kind == Kind::kWrite || sent[k].kind == Kind::kScript)
      (*packed)[sent[k].record].may_be_ours = true;
  }
  // What each answered command did, taken the first time it is clear, whether or not the round
  // as a whole succeeds: the retry of a round that failed for another record's sake (an error
  // reply, or the connection lost partway) sends this one only what it still lacks.
  for (size_t k = 0; k < answered; ++k) {
    const protocol::RedisReply& reply = replies[k];
    const bool error = reply.type == protocol::RedisReply::Type::kError;
    if (sent[k].kind == Kind::kDelete) {  // refused for good: left, the inputs expire
      if (!error || !protocol::IsTransientRedisError(reply.str))
        owed_deletes_.erase(owed_deletes_.begin(), owed_deletes_.begin() + owed);
      continue;
    }
    PackedResult& p = (*packed)[sent[k].record];
    switch (sent[k].kind) {
      case Kind::kWrite:
      case Kind::kScript:
        if (reply.type == protocol::RedisReply::Type::kStatus) {
          p.decided = p.stored = true;
          p.notice_published = sent[k].kind == Kind::kScript;  // the script published it
        } else if (reply.type == protocol::RedisReply::Type::kNil) {
          p.decided = true;
          p.found_there = !p.may_be_ours;
        } else if (error && !protocol::IsTransientRedisError(reply.str)) {
          // Refused, perhaps after it was stored (a reply lost and replaced; a script whose
          // PUBLISH was refused after its SET): a later nil may be this record.
          p.may_be_ours = true;
        }
        break;
      case Kind::kPublish:  // after its write: a notice counts once the record is there
        if (!error && p.stored) p.notice_published = true;
        break;
      case Kind::kDelete:
        break;
    }
  }
  if (!s.ok()) return s;
  // A Redis that refuses notices for good (an ACL without EVAL or PUBLISH: NOPERM, or inside
  // the script a refusal without it; a managed service that disabled or renamed EVAL: unknown
  // command) must not stop results from being written: stop using them, and let the retry write
  // plain SETs (a record the script stored before its PUBLISH was refused makes that SET NX a
  // nil, which may_be_ours keeps from counting). Other errors (LOADING, BUSY, READONLY, OOM...)
  // pass; they are retried like any failed write.
  for (size_t k = 0; k < sent.size(); ++k) {
    const std::string& error = replies[k].str;
    if ((sent[k].kind == Kind::kScript || sent[k].kind == Kind::kPublish) &&
        replies[k].type == protocol::RedisReply::Type::kError &&
        (protocol::IsAclRefusal(error) || error.find("unknown command") != std::string::npos)) {
      scripts_ok_ = false;
      spdlog::error(
          "result writer: Redis refuses result notices ({}); writing results without notices "
          "from now on",
          error);
      return Status::Internal("redis: " + error);
    }
  }
  // An error reply that goes away by itself fails the round (retried); one that cannot is that
  // job's alone: its write is marked refused, the others stand.
  for (const protocol::RedisReply& reply : replies) {
    if (reply.type == protocol::RedisReply::Type::kError &&
        protocol::IsTransientRedisError(reply.str))
      return Status::Internal("redis: " + reply.str);
  }
  for (size_t k = 0; k < sent.size(); ++k) {
    if (sent[k].kind != Kind::kWrite && sent[k].kind != Kind::kScript) continue;
    PackedResult& p = (*packed)[sent[k].record];
    if (!p.decided && replies[k].type == protocol::RedisReply::Type::kError)
      p.refused = replies[k].str;
  }
  return Status::Ok();
}

void ResultWriter::ReplaceWithFailure(PackedResult* p) const {
  protocol::ResultRecord rec;
  rec.id = p->id;
  rec.status = "failed";
  rec.model = p->model;
  rec.worker = options_.worker_name;
  rec.error_code = std::string(codes::kInternal);
  rec.error_message = "Redis refused this job's result: " + p->refused;
  rec.batch_size = p->batch_size;
  rec.attempt = p->attempt;
  rec.timing_us = {{"finished", protocol::NowMicros()}};
  msgpack::sbuffer buf(512);
  protocol::Packer pk(buf);
  protocol::PackResult(pk, rec);
  p->record = std::move(buf);
  // p->ttl stays the job's (its result_ttl_s, or the default): this is its final result.
  p->notify.clear();  // plain SET NX: the broker's FINISHED tells the producer
  p->scripted = false;
  p->refused.clear();
  p->replaced = true;
  // The failure record's write starts afresh; a nil for it is read as for any record (and a
  // record found there may be the job's own, from the refused write: Report).
  p->decided = p->stored = p->found_there = p->may_be_ours = p->notice_published = p->tried = false;
}

bool ResultWriter::WriteWithRetries(std::vector<PackedResult>* packed) {
  if (!WriteBatchWithRetries(packed)) return false;
  // Records Redis refused for good: a failure record in their place, written once more.
  std::vector<size_t> redo;
  for (size_t i = 0; i < packed->size(); ++i) {
    PackedResult& p = (*packed)[i];
    if (p.refused.empty()) continue;
    if (p.replaced) {
      spdlog::error(
          "result writer: job {}: Redis refused even its failure record ({}); it is "
          "reported without a result",
          p.id, p.refused);
      p.refused.clear();
      continue;
    }
    spdlog::error(
        "result writer: job {}: Redis refused its result for good ({}); writing a "
        "failure record instead",
        p.id, p.refused);
    ReplaceWithFailure(&p);
    redo.push_back(i);
  }
  if (redo.empty()) return true;
  std::vector<PackedResult> again;
  for (size_t i : redo) again.push_back(std::move((*packed)[i]));
  const bool ok = WriteWithRetries(&again);
  for (size_t k = 0; k < redo.size(); ++k) (*packed)[redo[k]] = std::move(again[k]);
  return ok;
}

bool ResultWriter::WriteBatchWithRetries(std::vector<PackedResult>* packed) {
  int backoff_ms = options_.backoff_initial_ms;
  for (int64_t attempt = 1;; ++attempt) {
    const Status s = WriteOnce(packed);
    if (s.ok()) {
      if (attempt > 1)
        spdlog::info("result writer: redis back, wrote {} results after {} attempts",
                     packed->size(), attempt);
      return true;
    }
    if (options_.metrics != nullptr) options_.metrics->OnWriteError();
    if (IsPowerOfTwo(attempt)) {
      spdlog::warn("result writer: {} results not written (attempt {}): {}; retrying",
                   packed->size(), attempt, s.ToString());
    }
    if (!Backoff(backoff_ms)) return false;
    backoff_ms = std::min(backoff_ms * 2, options_.backoff_max_ms);
  }
}

void ResultWriter::Report(std::vector<JobResult>* batch, std::vector<PackedResult>* packed) {
  // A job whose record Redis refused has a failure record in its place, or none: it failed. (A
  // failure record that found a record there, SET NX's nil, leaves the job as it was: that
  // record may be its own, from the refused write; so it is no duplicate either.)
  int64_t duplicates = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    const PackedResult& p = (*packed)[i];
    if (p.replaced && !p.found_there)
      (*batch)[i].status = Status::Internal("Redis refused its result");
    if (p.found_there && !p.replaced) ++duplicates;
  }
  const std::vector<JobResult>& results = *batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_ += static_cast<int64_t>(results.size());
    duplicates_ += duplicates;
  }
  if (duplicates > 0) {
    spdlog::info("result writer: {} of {} result(s) already had a final result (first wins)",
                 duplicates, results.size());
  }
  if (options_.metrics != nullptr) options_.metrics->OnWritten(results, duplicates);
  DoneReport report;
  report.ids.reserve(results.size());
  report.duplicates = duplicates;
  for (size_t i = 0; i < results.size(); ++i) {
    const JobResult& r = results[i];
    report.ids.push_back(r.job.entry.id);
    if (!r.status.ok()) report.not_done.emplace_back(r.job.entry.id, ResultStatus(r.status));
    PackedResult& p = (*packed)[i];
    if (!p.stored) continue;
    if (p.notice_published) {
      report.notified.push_back(r.job.entry.id);  // its producer has the record already
    } else if (p.record.size() <= options_.inline_result_bytes) {
      report.inline_results.emplace_back(r.job.entry.id, std::string(p.value()));
    }
  }
  if (!outbox_->Push(std::move(report)))
    spdlog::error("result writer: {} DONE ids not reported (the I/O thread has stopped)",
                  results.size());
}

}  // namespace ferry::worker
