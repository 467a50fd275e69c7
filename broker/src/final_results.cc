#include "final_results.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis_errors.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {

void FinalResults::Add(std::unique_ptr<Job> job, std::string status, std::string code,
                       std::string message) {
  // The job will not run: its inputs go now, not when Redis takes the result. (Out of the queue
  // they no longer count against --max-pending-bytes; without the journal, Redis down, jobs
  // expiring and cancelled would otherwise hold their bytes for as long as it stays down.)
  std::string().swap(job->inputs_raw);
  job->frames.clear();
  entries_.push_back({std::move(job), std::move(status), std::move(code), std::move(message)});
}

std::unordered_set<std::string_view> FinalResults::PendingIds() const {
  std::unordered_set<std::string_view> ids;
  for (const auto& e : entries_) ids.insert(e.job->id);
  return ids;
}

std::string FinalResults::Remove(std::string_view id, int64_t seq) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.job->id == id && e.job->seq == seq; });
  if (it == entries_.end()) return "";
  std::string what = it->status == "failed" ? it->code : it->status;
  entries_.erase(it);
  return what;
}

Status FinalResults::Flush(std::vector<Written>* written) {
  written->clear();
  if (entries_.empty()) return Status::Ok();
  const int64_t now = protocol::NowMicros();
  for (const auto& e : entries_) {
    protocol::ResultRecord rec;
    rec.id = e.job->id;
    rec.status = e.status;
    rec.model = e.job->model;
    rec.error_code = e.code;
    rec.error_message = e.message;
    rec.attempt = e.job->attempt;
    rec.timing_us = {{"submitted", e.job->submitted_us}, {"finished", now}};
    msgpack::sbuffer buf;
    protocol::Packer pk(buf);
    protocol::PackResult(pk, rec);
    const std::string ttl = std::to_string(
        std::min(e.job->result_ttl_s > 0 ? e.job->result_ttl_s : protocol::kDefaultResultTtlS,
                 protocol::kMaxExpirySeconds));
    redis_->Append({"SET", keys_.Result(e.job->id), std::string_view(buf.data(), buf.size()), "EX",
                    ttl, "NX"});
    // Its stored inputs go with the final result (the job will not run any more).
    if (!e.job->stored_inputs.empty()) {
      std::vector<std::string> keys;
      for (int32_t i : e.job->stored_inputs) keys.push_back(keys_.Input(e.job->id, i));
      std::vector<std::string_view> argv{"DEL"};
      for (const auto& k : keys) argv.push_back(k);
      redis_->Append(argv);
    }
  }
  std::vector<protocol::RedisReply> replies;
  FERRY_RETURN_IF_ERROR(redis_->Flush(&replies));
  // Replies in order: each entry's SET, then its DEL if it has stored inputs.
  std::vector<Entry> again;
  std::string transient;
  size_t r = 0;
  for (auto& e : entries_) {
    const size_t set_reply = r;
    r += e.job->stored_inputs.empty() ? 1 : 2;
    if (set_reply >= replies.size() ||
        replies[set_reply].type != protocol::RedisReply::Type::kError) {
      written->push_back({std::move(e.job), std::move(e.status), std::move(e.code)});
      continue;
    }
    const std::string& error = replies[set_reply].str;
    if (protocol::IsTransientRedisError(error)) {
      transient = error;
      again.push_back(std::move(e));
    } else {
      spdlog::error("job {}: Redis refused its {} result for good ({}); it is finished without one",
                    e.job->id, e.status, error);
      written->push_back({std::move(e.job), std::move(e.status), std::move(e.code)});
    }
  }
  entries_ = std::move(again);
  if (!entries_.empty()) return Status::Unavailable("redis: " + transient);
  return Status::Ok();
}

}  // namespace ferry::broker
