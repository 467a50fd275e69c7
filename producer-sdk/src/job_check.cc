#include "job_check.h"

#include "ferry/protocol/redis_errors.h"
#include "ferry/protocol/types.h"

namespace ferry::client {
namespace {

constexpr size_t kMaxTensorBytes = (size_t{1} << 31) - 1;  // one msgpack bin

// `id` is the job's id after defaulting (Job::id may be empty); inputs of at least
// `stored_input_bytes` (when > 0) are stored in Redis.
Status ValidateJob(const Job& job, const std::string& id, int64_t stored_input_bytes) {
  if (!protocol::IsValidJobId(id))
    return Status::InvalidArgument("job id \"" + id +
                                   "\" must be 1-128 characters of [A-Za-z0-9._:-]");
  if (job.model.empty() || job.model.size() > protocol::kMaxModelName)
    return Status::InvalidArgument("job model must be 1-128 characters");
  if (job.inputs.size() > protocol::kMaxInputsPerJob)
    return Status::InvalidArgument("a job takes at most 64 inputs");
  if (job.timeout_ms < 0) return Status::InvalidArgument("timeout_ms must be >= 0");
  if (job.result_ttl_s < 0) return Status::InvalidArgument("result_ttl_s must be >= 0");
  for (size_t i = 0; i < job.inputs.size(); ++i) {
    const Tensor& t = job.inputs[i];
    std::string where = "input " + std::to_string(i) + ": ";
    if (t.shape.size() > protocol::kMaxTensorDims)
      return Status::InvalidArgument(where + "more than 16 dimensions");
    int64_t numel = NumElements(t.shape);
    if (numel < 0) return Status::InvalidArgument(where + "bad shape");
    uint64_t want = static_cast<uint64_t>(numel) * ItemSize(t.dtype);
    if (t.data.size() != want) {
      return Status::InvalidArgument(where + std::to_string(t.data.size()) + " bytes of data; " +
                                     DTypeName(t.dtype) + " with this shape needs " +
                                     std::to_string(want));
    }
    if (t.data.size() > kMaxTensorBytes)
      return Status(codes::kTooLarge, where + "over 2 GiB of data");
    if (stored_input_bytes > 0 && t.data.size() >= static_cast<size_t>(stored_input_bytes) &&
        t.data.size() > protocol::kMaxValueDataBytes)
      return Status(codes::kTooLarge, where + std::to_string(t.data.size()) +
                                          " bytes; a stored input is one Redis value, at most " +
                                          std::to_string(protocol::kMaxValueDataBytes) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

bool IsStored(const Tensor& t, int64_t stored_input_bytes) {
  return stored_input_bytes > 0 && t.data.size() >= static_cast<size_t>(stored_input_bytes);
}

size_t SubmitBytes(const Job& job, const std::string& id, int64_t stored_input_bytes) {
  size_t bytes = 128 + id.size() + job.model.size();
  for (const Tensor& t : job.inputs)
    bytes += 64 + 9 * t.shape.size() + (IsStored(t, stored_input_bytes) ? 0 : t.data.size());
  return bytes;
}

size_t SubmitHeaderBytes(const ClientOptions& options) {
  return 1024 + options.redis_prefix.size();
}

Status CheckJob(const Job& job, const std::string& id, const ClientOptions& options,
                int64_t broker_max_job_bytes) {
  FERRY_RETURN_IF_ERROR(ValidateJob(job, id, options.stored_input_bytes));
  // The job limit first: over it, storing the inputs (the message limit's advice) cannot help.
  if (broker_max_job_bytes > 0) {
    size_t inputs = 0;
    for (const Tensor& t : job.inputs) inputs += t.data.size();
    if (inputs > static_cast<size_t>(broker_max_job_bytes))
      return Status(codes::kTooLarge, "job \"" + id + "\" has " + std::to_string(inputs) +
                                          " bytes of inputs; the broker takes at most " +
                                          std::to_string(broker_max_job_bytes) +
                                          " a job (its --max-job-bytes): not sent");
  }
  const size_t bytes =
      SubmitHeaderBytes(options) + SubmitBytes(job, id, options.stored_input_bytes);
  if (bytes > static_cast<size_t>(options.max_message_bytes))
    return Status(codes::kTooLarge,
                  "job \"" + id + "\" needs up to " + std::to_string(bytes) +
                      " bytes in its SUBMIT; the broker takes at most " +
                      std::to_string(options.max_message_bytes) +
                      " (max_message_bytes, the broker's --max-message-bytes): store its big "
                      "inputs in Redis (stored_input_bytes) or raise both");
  return Status::Ok();
}

}  // namespace ferry::client
