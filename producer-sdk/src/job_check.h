#pragma once
// The SDK's own checks of a job before anything of it is sent, and what a job adds to a SUBMIT
// message: Client's Submit, SubmitMany and Run run CheckJob on each job, and SubmitMany splits
// its SUBMITs by SubmitBytes (client_submit.cc).

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/client.h"

namespace ferry::client {

// Tensor data per SUBMIT message (or ClientOptions::max_message_bytes, if less): SubmitMany
// sends more jobs as several SUBMITs; a single bigger job goes alone.
inline constexpr size_t kMaxSubmitBytes = size_t{32} << 20;

// Whether input `t` goes to Redis rather than inside the SUBMIT (ClientOptions::
// stored_input_bytes: inputs of at least that many bytes, when it is > 0).
bool IsStored(const Tensor& t, int64_t stored_input_bytes);

// At least what job `id` adds to a SUBMIT's body and data frames: its inputs that are not
// stored, each input's dtype and shape (at most 9 bytes a dimension), its id, model and options
// (msgpack keys, integers of at most 9 bytes).
size_t SubmitBytes(const Job& job, const std::string& id, int64_t stored_input_bytes);

// At least what a SUBMIT's body holds besides its jobs: "rid", "ack", "inline_results",
// "notify" (the prefix, "notify:" and a token), the jobs array's header.
size_t SubmitHeaderBytes(const ClientOptions& options);

// Job `id` (its id after defaulting: Job::id may be empty) as the broker would take it: a valid
// id and model, at most 64 inputs, each tensor's data matching its dtype and shape, a stored
// input within one Redis value (invalid_argument, too_large); once the broker has said it
// (LIMITS; 0 before), inputs of no more than broker_max_job_bytes in all, stored ones included
// (too_large): a job over it is refused before its inputs are written to Redis; and, with the
// SUBMIT's header, no more than options.max_message_bytes (too_large): a frame over the broker's
// limit would make it drop the connection without an answer. A job over both is refused for
// the job limit (the Python client's order too): storing its inputs would not help.
Status CheckJob(const Job& job, const std::string& id, const ClientOptions& options,
                int64_t broker_max_job_bytes);

}  // namespace ferry::client
