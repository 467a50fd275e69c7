#pragma once
// ferry::Result: a job's final record as stored in Redis under <prefix>result:<id>
// (docs/protocol.md, "Results"). Public header: includes only the standard library.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

enum class JobState { kPending, kDone, kFailed, kCancelled, kExpired };

// "pending", "done", "failed", "cancelled", "expired".
const char* JobStateName(JobState state);

struct Result {
  std::string id;
  JobState state = JobState::kPending;
  std::vector<Tensor> outputs;  // when done: the model's outputs, without the batch dimension
  Status error;                 // when failed/cancelled/expired: the code and message
  std::string model;
  std::string worker;      // the worker that produced the result ("" if none ran it)
  int64_t batch_size = 0;  // size of the batch the job ran in
  int64_t attempt = 0;     // 1 on the first run; more after a requeue
  // Microsecond wall-clock timestamps: submitted, dispatched, received, compute_start,
  // compute_end, finished (see docs/protocol.md).
  std::map<std::string, int64_t> timing_us;
};

}  // namespace ferry
