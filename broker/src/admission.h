#pragma once
// Admission: whether the broker accepts one decoded SUBMIT job, checked against its state and
// limits before the job is queued. The checks run in this order and the first that fails names
// the code: the model is known (some worker announced it, or the journal restored it) else
// `unknown_model`; the inputs match one of the model's announced input specs (count, dtype,
// rank, every size the spec fixes; stored inputs by their declared dtype and shape) else
// `invalid_argument` naming the input, the expected and the received form; the inputs' tensor
// bytes are at most max_job_bytes else `too_large`; with the journal on, the bytes of the inputs
// that are not stored (the journal record holds them) are at most kMaxValueDataBytes else
// `too_large`; the id is not pending already else
// `duplicate`; the model's queue holds fewer than max_queue jobs
// else `queue_full`; the pending input bytes plus this job's stay within max_pending_bytes else
// `queue_full` (both queue_full rejections are retryable). The message names the model or the
// limit. Needs no sockets and no Redis: a Scheduler and the options are all it reads.
//
// SubmitJob is only forward-declared here, so that this header pulls in neither msgpack nor
// ZeroMQ; callers that build one include "ferry/protocol/messages.h".

#include <string>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"

namespace ferry::protocol {
struct SubmitJob;
}  // namespace ferry::protocol

namespace ferry::broker {

class Scheduler;
struct BrokerOptions;

// OK when `inputs` match one of `specs` (or `specs` is empty); otherwise kInvalidArgument with
// a message about the first spec: the count, or the first input that differs ("model \"m\"
// input 0 (\"x\"): expected float32 [-1, 80], got float16 [100, 80]"). Per input: a dtype
// compare and a shape compare; no allocation unless it fails.
Status CheckInputs(const std::string& model,
                   const std::vector<std::vector<protocol::InputSpec>>& specs,
                   const std::vector<protocol::TensorRef>& inputs);

// OK when `in` may be accepted; otherwise the first failing check's code and a message.
// Reads `scheduler` only; changes nothing.
Status Admit(const protocol::SubmitJob& in, const Scheduler& scheduler,
             const BrokerOptions& options);

}  // namespace ferry::broker
