#pragma once
// Admission: whether the broker accepts one decoded SUBMIT job, checked against its state and
// limits before the job is queued. The checks run in this order and the first that fails names
// the code: the id is not pending already else `duplicate` (first: any other rejection then
// says the id is not pending); the model is known (some worker announced it, or the journal
// restored it) else `unknown_model`; the inputs match one of the model's announced input specs
// (protocol::CheckInputs: count, dtype, rank, every size the spec fixes; stored inputs by their
// declared dtype and shape) else `invalid_argument` naming the input, the expected and the
// received form; result_ttl_s is at most max_result_ttl_s else `invalid_argument`; the inputs'
// tensor bytes are at most max_job_bytes else `too_large`; with the journal on, the bytes of
// the inputs that are not stored (the journal record holds them) are at most kMaxValueDataBytes
// else `too_large`; the model's queue holds fewer than max_queue jobs else `queue_full`; the
// pending input bytes plus this job's stay within max_pending_bytes else `queue_full` (both
// queue_full rejections are retryable). The message names the model or the limit. Needs no
// sockets and no Redis: a Scheduler and the options are all it reads.
//
// SubmitJob is only forward-declared here, so that this header pulls in neither msgpack nor
// ZeroMQ; callers that build one include "ferry/protocol/messages.h".

#include "ferry/status.h"

namespace ferry::protocol {
struct SubmitJob;
}  // namespace ferry::protocol

namespace ferry::broker {

class Scheduler;
struct BrokerOptions;

// OK when `in` may be accepted; otherwise the first failing check's code and a message.
// Reads `scheduler` only; changes nothing.
Status Admit(const protocol::SubmitJob& in, const Scheduler& scheduler,
             const BrokerOptions& options);

}  // namespace ferry::broker
