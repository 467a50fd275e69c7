#include "admission.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/broker/broker.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis_errors.h"
#include "ferry/protocol/util.h"
#include "scheduler.h"

namespace ferry::broker {
namespace {

std::string Describe(DType dtype, const std::vector<int64_t>& shape) {
  std::string out = std::string(DTypeName(dtype)) + " [";
  for (size_t d = 0; d < shape.size(); ++d)
    out += (d ? ", " : "") + (shape[d] < 0 ? std::string("-1") : std::to_string(shape[d]));
  return out + "]";
}

std::string InputName(size_t k, const protocol::InputSpec& spec) {
  return "input " + std::to_string(k) + (spec.name.empty() ? "" : " (\"" + spec.name + "\")");
}

bool Matches(const Scheduler::InputSpecs& spec, const std::vector<protocol::TensorRef>& inputs) {
  if (spec.size() != inputs.size()) return false;
  for (size_t k = 0; k < spec.size(); ++k) {
    const auto& want = spec[k];
    const auto& got = inputs[k];
    if (want.dtype != got.dtype || want.shape.size() != got.shape.size()) return false;
    for (size_t d = 0; d < want.shape.size(); ++d)
      if (want.shape[d] >= 0 && want.shape[d] != got.shape[d]) return false;
  }
  return true;
}

// Why `inputs` do not match `spec` (which they do not).
std::string Mismatch(const std::string& model, const Scheduler::InputSpecs& spec,
                     const std::vector<protocol::TensorRef>& inputs) {
  const std::string head = "model \"" + model + "\" ";
  if (spec.size() != inputs.size()) {
    std::string list;
    for (size_t k = 0; k < spec.size(); ++k)
      list +=
          (k ? ", " : "") + InputName(k, spec[k]) + ": " + Describe(spec[k].dtype, spec[k].shape);
    return head + "takes " + std::to_string(spec.size()) + " input(s) (" + list + "), got " +
           std::to_string(inputs.size());
  }
  for (size_t k = 0; k < spec.size(); ++k) {
    if (Matches({spec[k]}, {inputs[k]})) continue;
    return head + InputName(k, spec[k]) + ": expected " + Describe(spec[k].dtype, spec[k].shape) +
           ", got " + Describe(inputs[k].dtype, inputs[k].shape);
  }
  return head + "inputs do not match";  // not reached
}

}  // namespace

Status CheckInputs(const std::string& model,
                   const std::vector<std::vector<protocol::InputSpec>>& specs,
                   const std::vector<protocol::TensorRef>& inputs) {
  for (const auto& spec : specs)
    if (Matches(spec, inputs)) return Status::Ok();
  if (specs.empty()) return Status::Ok();
  std::string message = Mismatch(model, specs.front(), inputs);
  if (specs.size() > 1)
    message += " (its workers announce " + std::to_string(specs.size()) +
               " different input specs; the job matches none: see `ferry models`)";
  return Status::InvalidArgument(std::move(message));
}

Status Admit(const protocol::SubmitJob& in, const Scheduler& scheduler,
             const BrokerOptions& options) {
  // First: any other rejection then says the id is not pending, so the producer may delete the
  // job's stored inputs (a duplicate's are the pending job's: the same id, the same keys).
  if (scheduler.IsPending(in.id)) return Status(codes::kDuplicate, "a job with this id is pending");
  if (!scheduler.KnowsModel(in.model))
    return Status(codes::kUnknownModel,
                  "no worker serves model \"" + protocol::Printable(in.model) + "\"");
  if (const auto* specs = scheduler.SpecsOf(in.model); specs != nullptr && !specs->empty())
    FERRY_RETURN_IF_ERROR(CheckInputs(in.model, *specs, in.inputs));
  if (in.result_ttl_s > options.max_result_ttl_s)
    return Status::InvalidArgument("result_ttl_s " + std::to_string(in.result_ttl_s) +
                                   " is above the broker's --max-result-ttl-s " +
                                   std::to_string(options.max_result_ttl_s));
  size_t bytes = 0;
  for (const auto& t : in.inputs) bytes += t.size;
  if (static_cast<int64_t>(bytes) > options.max_job_bytes)
    return Status(codes::kTooLarge, "job inputs are " + std::to_string(bytes) +
                                        " bytes; the limit is " +
                                        std::to_string(options.max_job_bytes));
  if (options.journal) {
    // The journal record holds the bytes of every input that is not stored, and Redis refuses
    // a value over 512 MiB (proto-max-bulk-len): such a job could never be journaled.
    size_t journaled = 0;
    for (const auto& t : in.inputs) journaled += t.stored ? 0 : t.size;
    if (journaled > protocol::kMaxValueDataBytes)
      return Status(codes::kTooLarge,
                    "job inputs sent through the broker are " + std::to_string(journaled) +
                        " bytes; the journal holds at most " +
                        std::to_string(protocol::kMaxValueDataBytes) +
                        " (Redis's largest value is 512 MiB): store them in Redis (the claim "
                        "check) or run the broker with --no-journal");
  }
  if (static_cast<int64_t>(scheduler.QueueDepth(in.model)) >= options.max_queue)
    return Status(codes::kQueueFull, "the queue of model \"" + in.model + "\" holds " +
                                         std::to_string(options.max_queue) + " jobs; retry later");
  if (scheduler.pending_bytes() + static_cast<int64_t>(bytes) > options.max_pending_bytes)
    return Status(codes::kQueueFull, "the broker holds its limit of pending input bytes (" +
                                         std::to_string(options.max_pending_bytes) +
                                         "); retry later");
  return Status::Ok();
}

}  // namespace ferry::broker
