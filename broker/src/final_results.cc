#include "final_results.h"

#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"

namespace ferry::broker {

void FinalResults::Add(std::unique_ptr<Job> job, std::string status, std::string code,
                       std::string message) {
  entries_.push_back({std::move(job), std::move(status), std::move(code), std::move(message)});
}

Status FinalResults::Flush(std::vector<std::unique_ptr<Job>>* written) {
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
    const std::string ttl = std::to_string(e.job->result_ttl_s > 0 ? e.job->result_ttl_s
                                                                   : protocol::kDefaultResultTtlS);
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
  FERRY_RETURN_IF_ERROR(redis_->Flush(nullptr));
  for (auto& e : entries_) written->push_back(std::move(e.job));
  entries_.clear();
  return Status::Ok();
}

}  // namespace ferry::broker
