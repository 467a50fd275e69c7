#include "admission.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/broker/broker.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "scheduler.h"

namespace ferry::broker {

Status Admit(const protocol::SubmitJob& in, const Scheduler& scheduler,
             const BrokerOptions& options) {
  if (!scheduler.KnowsModel(in.model))
    return Status(codes::kUnknownModel,
                  "no worker serves model \"" + protocol::Printable(in.model) + "\"");
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
  if (scheduler.IsPending(in.id)) return Status(codes::kDuplicate, "a job with this id is pending");
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
