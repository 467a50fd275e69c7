#pragma once
// FinalResults: the results the broker writes itself -- `expired`, `cancelled` and `poisoned`
// jobs, which no worker will report. They are kept until Redis takes them (retried every loop
// turn while it is down), so an accepted job is never left without a final result.
// Owned by the broker thread; not thread-safe.

#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/status.h"
#include "job.h"

namespace ferry::broker {

class FinalResults {
 public:
  FinalResults(protocol::RedisClient* redis, protocol::Keys keys)
      : redis_(redis), keys_(std::move(keys)) {}

  // `status` is "expired", "cancelled" or "failed"; `code`/`message` go into the error. The
  // job's input bytes (inputs_raw, frames) are released here: only its id, model, stored inputs'
  // indexes and producer are kept.
  void Add(std::unique_ptr<Job> job, std::string status, std::string code, std::string message);
  bool empty() const { return entries_.empty(); }
  // The ids of the entries Redis has not taken yet (views: valid until the next Add or Flush).
  std::unordered_set<std::string_view> PendingIds() const;
  size_t size() const { return entries_.size(); }
  // Takes back the entry of job `id` accepted as `seq`, if Redis has not taken it: for a job
  // whose acceptance is withdrawn (the journal write of the turn it ended in failed). Returns
  // what it was (its status; for a failure, its code), or "" when there was none.
  std::string Remove(std::string_view id, int64_t seq);

  // A job whose result Redis took, and how it ended: `status` as given to Add, `code` its
  // error's code ("poisoned" for a failure the broker's metrics count apart).
  struct Written {
    std::unique_ptr<Job> job;
    std::string status;
    std::string code;
  };
  // Writes every entry (SET NX EX; and DEL of the job's stored inputs) in one round trip, and
  // moves into *written (for the metrics, FINISHED notices and journal removal) the jobs whose
  // write Redis answered: stored, a duplicate, or refused for good (an error reply that retrying
  // cannot cure, e.g. WRONGTYPE: logged with the job id, never retried). Transport failures and
  // transient error replies (LOADING, OOM, ...) keep the entries for the next call and fail.
  Status Flush(std::vector<Written>* written);

 private:
  struct Entry {
    std::unique_ptr<Job> job;
    std::string status;
    std::string code;
    std::string message;
  };
  protocol::RedisClient* redis_;
  protocol::Keys keys_;
  std::vector<Entry> entries_;
};

}  // namespace ferry::broker
