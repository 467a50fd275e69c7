#include "admission.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/broker/broker.h"
#include "ferry/protocol/input_check.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis_errors.h"
#include "ferry/protocol/util.h"
#include "scheduler.h"

namespace ferry::broker {

Status Admit(const protocol::SubmitJob& in, const Scheduler& scheduler,
             const BrokerOptions& options) {
  // First: any other rejection then says the id is not pending, so the producer may delete the
  // job's stored inputs (a duplicate's are the pending job's: the same id, the same keys).
  if (scheduler.IsPending(in.id)) return Status(codes::kDuplicate, "a job with this id is pending");
  if (!scheduler.KnowsModel(in.model))
    return Status(codes::kUnknownModel,
                  "no worker serves model \"" + protocol::Printable(in.model) + "\"");
  if (const auto* specs = scheduler.SpecsOf(in.model); specs != nullptr && !specs->empty())
    FERRY_RETURN_IF_ERROR(protocol::CheckInputs(in.model, *specs, in.inputs));
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
