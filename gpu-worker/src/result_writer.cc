#include "result_writer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
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

ResultWriter::ResultWriter(zmq::context_t* context, Options options)
    : context_(context), options_(std::move(options)), keys_(options_.prefix) {}

ResultWriter::~ResultWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    aborted_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  const size_t abandoned = queue_.size() + (retry_ ? retry_->results.size() : 0);
  if (abandoned > 0) spdlog::error("result writer: {} results abandoned unwritten", abandoned);
}

void ResultWriter::Start() {
  try {
    push_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::push);
    push_->set(zmq::sockopt::linger, 0);
    push_->connect(options_.outbox_address);
  } catch (const zmq::error_t& e) {
    spdlog::critical("result writer: cannot connect to {}: {}", options_.outbox_address, e.what());
    push_.reset();
  }
  thread_ = std::thread([this] { Loop(); });
}

void ResultWriter::Submit(std::vector<JobResult> results) {
  if (results.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : results) queue_.push_back(std::move(r));
  // Whoever holds the writing role looks at the queue when it lets go (the writer thread
  // re-checks; a caller wakes it), so waking the thread now would only cost a context switch.
  if (!writing_) cv_.notify_all();
}

void ResultWriter::WriteOrSubmit(std::vector<JobResult> results) {
  if (results.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool idle = !writing_ && queue_.empty() && !retry_ && !stopping_ && client_ && push_;
    if (!idle) {
      for (auto& r : results) queue_.push_back(std::move(r));
      if (!writing_) cv_.notify_all();
      return;
    }
    writing_ = true;
    in_flight_ += results.size();
  }
  std::vector<PackedResult> packed = Pack(&results);
  int64_t duplicates = 0;
  const Status s = WriteOnce(&packed, /*first_try=*/true, &duplicates);
  if (s.ok()) {
    Report(results, packed, duplicates, /*by_caller=*/true);
  } else {
    if (options_.metrics != nullptr) options_.metrics->OnWriteError();
    spdlog::warn("result writer: {} results not written ({}); the writer thread retries",
                 packed.size(), s.ToString());
  }
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ -= results.size();
  writing_ = false;
  if (!s.ok()) retry_ = PackedBatch{std::move(results), std::move(packed)};
  // Wake the writer thread only if it has something to do (a wake-up costs a context switch).
  if (stopping_ || !queue_.empty() || retry_) cv_.notify_all();
}

void ResultWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  HeldDone held;
  if (push_ && TakeHeldDone(&held)) {
    // BrokerLink takes them all before it ends: only an owner whose link still runs gets these.
    spdlog::error("result writer: {} kept DONE ids left at stop; handing them to the outbox",
                  held.ids.size());
    Status s = protocol::SendMessage(
        *push_, nullptr, protocol::kDone,
        protocol::EncodeDone(held.ids, 0, held.not_done, {}, held.ids));
    if (!s.ok()) spdlog::error("result writer: {} kept DONE ids not handed over", held.ids.size());
  }
  push_.reset();  // nothing sends DONE any more (WriteOrSubmit queues once stopping)
}

bool ResultWriter::TakeHeldDone(HeldDone* out) {
  std::lock_guard<std::mutex> lock(held_mu_);
  if (held_.ids.empty()) return false;
  *out = std::move(held_);
  held_ = HeldDone{};
  held_since_us_.store(0);
  return true;
}

size_t ResultWriter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + in_flight_ + (retry_ ? retry_->results.size() : 0);
}

int64_t ResultWriter::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

int64_t ResultWriter::written_by_callers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_by_callers_;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = true;
  }
  // Connect early so that a wrong --redis shows in the log at start; writes retry anyway.
  Status s = protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_);
  if (!s.ok()) spdlog::warn("result writer: {}; will retry when there are results", s.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
  }
  while (true) {
    std::vector<JobResult> batch;
    std::vector<PackedResult> packed;
    int64_t first_attempt = 1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return !writing_ && (stopping_ || !queue_.empty() || retry_);
      });
      if (aborted_ || (queue_.empty() && !retry_)) break;
      writing_ = true;
      if (retry_) {  // a caller's failed try: already packed, its first try spent
        batch = std::move(retry_->results);
        packed = std::move(retry_->packed);
        retry_.reset();
        first_attempt = 2;
      } else {
        batch.swap(queue_);
      }
      in_flight_ += batch.size();
    }
    if (first_attempt == 1) packed = Pack(&batch);
    int64_t duplicates = 0;
    const bool written = WriteWithRetries(&packed, first_attempt, &duplicates);
    if (written) Report(batch, packed, duplicates, /*by_caller=*/false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ -= batch.size();
      writing_ = false;
    }
    if (!written) {
      spdlog::error("result writer: aborted with {} results unwritten", batch.size());
      break;
    }
  }
}

std::vector<ResultWriter::PackedResult> ResultWriter::Pack(std::vector<JobResult>* results) const {
  // Pack once; the outputs' memory (the batch tensors) is released right after.
  std::vector<PackedResult> packed;
  packed.reserve(results->size());
  const int64_t finished = protocol::NowMicros();
  for (JobResult& r : *results) {
    const protocol::ChunkJob& e = r.job.entry;
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
    rec.timing_us = {{"submitted", e.submitted_us}, {"dispatched", e.dispatched_us},
                     {"received", r.job.received_us}, {"finished", finished}};
    if (r.compute_start_us != 0) {
      rec.timing_us["compute_start"] = r.compute_start_us;
      rec.timing_us["compute_end"] = r.compute_end_us;
    }
    size_t size = 512 + rec.id.size() + rec.model.size() + rec.worker.size();
    for (const auto& t : rec.outputs) size += t.size + 16 * t.shape.size() + 64;
    msgpack::sbuffer buf(size);  // sized up front: no regrowth copies of the output bytes
    protocol::Packer pk(buf);
    protocol::PackResult(pk, rec);
    const int64_t ttl = e.result_ttl_s > 0 ? e.result_ttl_s : options_.default_ttl_s;
    PackedResult p;
    p.key = keys_.Result(e.id);
    p.value.assign(buf.data(), buf.size());
    p.ttl = std::to_string(ttl);
    if (!e.notify.empty()) {
      // The notice is a FINISHED body for this one job, the record inside when small enough.
      protocol::InlineResults inline_record;
      if (p.value.size() <= options_.inline_result_bytes) inline_record.emplace_back(e.id, p.value);
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

Status ResultWriter::WriteOnce(std::vector<PackedResult>* packed, bool first_try,
                               int64_t* duplicates) {
  if (!client_) {
    FERRY_RETURN_IF_ERROR(
        protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_));
  }
  const bool scripts = scripts_ok_.load(std::memory_order_relaxed);
  // Notices first: Redis (6 and 7, without io-threads) writes the replies of one event-loop turn
  // to their clients newest-queued first. Without a PING this connection is queued by the first
  // script's reply, after that script's notice, and is written to before it. A leading PING
  // queues this connection before any notice, so the producers, who are blocked on the notices,
  // are written to first and this worker after them (docs/performance.md, step 12). A pipeline
  // longer than one read of Redis's (16 KiB) spans turns and keeps the ordering only in part.
  // The PING's reply is dropped below.
  const bool leading_ping =
      scripts && std::any_of(packed->begin(), packed->end(),
                             [](const PackedResult& p) { return !p.notify.empty(); });
  if (leading_ping) client_->Append({"PING"});
  for (auto& p : *packed) {
    if (!scripts) p.notify.clear();  // plain writes; the broker's FINISHED tells the producer
    if (p.notify.empty()) {
      client_->Append({"SET", p.key, p.value, "EX", p.ttl, "NX"});
    } else {
      client_->Append({"EVAL", kSetAndPublish, "1", p.key, p.value, p.ttl, p.notify, p.notice});
    }
  }
  std::vector<protocol::RedisReply> replies;
  Status s = client_->Flush(&replies);
  if (s.ok() && leading_ping && !replies.empty()) replies.erase(replies.begin());
  // A Redis that refuses scripts for good (an ACL without EVAL or PUBLISH: NOPERM; a managed
  // service that disabled or renamed EVAL: unknown command) must not stop results from being
  // written: stop using them, and let the retry write plain SETs. Other errors (LOADING, BUSY,
  // READONLY, OOM...) pass; they are retried like any failed write.
  for (size_t i = 0; s.ok() && i < replies.size() && i < packed->size(); ++i) {
    const std::string& error = replies[i].str;
    if (!(*packed)[i].notify.empty() && replies[i].type == protocol::RedisReply::Type::kError &&
        (error.find("NOPERM") != std::string::npos ||
         error.find("unknown command") != std::string::npos)) {
      scripts_ok_.store(false, std::memory_order_relaxed);
      spdlog::error("result writer: Redis refuses the result-notice script ({}); writing "
                    "results without notices from now on", error);
      return Status::Internal("redis: " + error);
    }
  }
  int64_t nil = 0;
  for (const auto& reply : replies) {
    if (s.ok() && reply.type == protocol::RedisReply::Type::kError)
      s = Status::Internal("redis: " + reply.str);
    if (reply.type == protocol::RedisReply::Type::kNil) ++nil;
  }
  // On a retry a nil may be our own earlier write that got through: count first tries only.
  if (s.ok() && first_try) {
    *duplicates = nil;
    if (replies.size() == packed->size()) {
      for (size_t i = 0; i < packed->size(); ++i)
        (*packed)[i].stored = replies[i].type == protocol::RedisReply::Type::kStatus;
    }
  }
  return s;
}

bool ResultWriter::WriteWithRetries(std::vector<PackedResult>* packed, int64_t attempt,
                                    int64_t* duplicates) {
  *duplicates = 0;
  int backoff_ms = options_.backoff_initial_ms;
  if (attempt > 1) {  // a caller's try just failed: pause as after any failed try
    if (!Backoff(backoff_ms)) return false;
    backoff_ms = std::min(backoff_ms * 2, options_.backoff_max_ms);
  }
  for (;; ++attempt) {
    const Status s = WriteOnce(packed, attempt == 1, duplicates);
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

void ResultWriter::Report(const std::vector<JobResult>& results,
                          const std::vector<PackedResult>& packed, int64_t duplicates,
                          bool by_caller) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_ += static_cast<int64_t>(results.size());
    if (by_caller) written_by_callers_ += static_cast<int64_t>(results.size());
    duplicates_ += duplicates;
  }
  if (duplicates > 0) {
    spdlog::info("result writer: {} of {} result(s) already had a final result (first wins)",
                 duplicates, results.size());
  }
  if (options_.metrics != nullptr) options_.metrics->OnWritten(results, duplicates);
  if (push_) SendDone(results, packed, duplicates);
}

void ResultWriter::SendDone(const std::vector<JobResult>& results,
                            const std::vector<PackedResult>& packed, int64_t duplicates) {
  std::vector<std::string> ids;
  ids.reserve(results.size());
  protocol::DoneStatuses not_done;  // for the broker's ferry_jobs_finished_total{status}
  protocol::InlineResults inline_results;
  std::vector<std::string> notified;  // stored, so the script published the notice
  for (size_t i = 0; i < results.size(); ++i) {
    const JobResult& r = results[i];
    ids.push_back(r.job.entry.id);
    if (!r.status.ok()) not_done.emplace_back(r.job.entry.id, ResultStatus(r.status));
    if (i >= packed.size() || !packed[i].stored) continue;
    if (!packed[i].notify.empty()) {
      notified.push_back(r.job.entry.id);  // its producer has the record: no need to inline it
    } else if (packed[i].value.size() <= options_.inline_result_bytes) {
      inline_results.emplace_back(r.job.entry.id, packed[i].value);
    }
  }
  if (options_.hold_notified_ids > 0) {
    std::lock_guard<std::mutex> lock(held_mu_);
    const bool all_notified = !ids.empty() && notified.size() == ids.size();
    if (all_notified && held_.ids.size() + ids.size() <= options_.hold_notified_ids) {
      bool wake = false;
      if (held_.ids.empty()) {
        held_.since_us = protocol::MonotonicMicros();
        held_since_us_.store(held_.since_us);
        wake = collector_asleep_.load();  // it would not look in time by itself
      }
      held_.ids.insert(held_.ids.end(), ids.begin(), ids.end());
      held_.not_done.insert(held_.not_done.end(), not_done.begin(), not_done.end());
      // Otherwise BrokerLink collects them (TakeHeldDone) without being woken.
      if (wake) protocol::SendMessage(*push_, nullptr, kKeptWake, protocol::EncodeEmpty());
      return;
    }
    if (!held_.ids.empty()) {  // this DONE goes now: what was kept rides along, first
      ids.insert(ids.begin(), held_.ids.begin(), held_.ids.end());
      notified.insert(notified.begin(), held_.ids.begin(), held_.ids.end());
      not_done.insert(not_done.begin(), held_.not_done.begin(), held_.not_done.end());
      held_ = HeldDone{};
      held_since_us_.store(0);
    }
  }
  Status s = protocol::SendMessage(
      *push_, nullptr, protocol::kDone,
      protocol::EncodeDone(ids, duplicates, not_done, inline_results, notified));
  if (!s.ok()) {
    spdlog::error("result writer: cannot hand {} DONE ids to the I/O thread: {}", ids.size(),
                  s.ToString());
  }
}

}  // namespace ferry::worker
