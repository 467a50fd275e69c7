#pragma once
// Journal: the broker's durable record of accepted jobs, in Redis, so that a broker restarted
// after a crash (kill -9 included) rebuilds its queues.
//
// Layout: HASH <prefix>journal, field = job id, value = a msgpack record (id, model, priority,
// timeout_ms, result_ttl_s, submitted, deadline, seq, attempt, inputs). SET <prefix>models holds
// every model a worker announced (so jobs for them are accepted right after a restart, before the
// workers re-announce); it expires a week after the last announcement (NoteModel: each READY,
// and hourly for the models connected workers serve).
//
// Group commit: accepted jobs are staged and written in ONE pipelined round trip per turn of the
// broker loop, before that turn's ACCEPTED replies go out. Removals of finished jobs are not
// urgent (a restarted broker skips journaled jobs that already have a result), so the broker
// lets them wait and ride along with the next write; it commits removals alone only when they
// have waited a few milliseconds, pile up, or the loop is idle. At light load that saves one
// Redis round trip per job. Owned by the broker thread; not thread-safe.

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/status.h"
#include "job.h"

namespace ferry::broker {

class Journal {
 public:
  // `redis` must outlive the journal.
  Journal(protocol::RedisClient* redis, protocol::Keys keys)
      : redis_(redis), keys_(std::move(keys)) {}

  // HSET on the next Commit. A removal of the same id still waiting (a finished job whose id
  // was accepted again) is dropped: it would delete the new record.
  void Stage(const Job& job);
  void Forget(const std::string& id, int64_t now_mono_us);  // HDEL, with the next write
  // A journaled job changed (requeued: its attempt), or Redis restarted and may have lost its
  // record (Broker::Impl::WatchRedisRestart): HSET again on the next Commit, retried
  // until one succeeds, so that a restarted broker counts the attempts already made. Only the
  // id waits here: the record is encoded from the job as it is at each try of the commit, so
  // that a job whose write waits for Redis is not held twice (re-encoding it at each try costs
  // what copying a held record into the request did).
  void Restage(const std::string& id);
  void NoteModel(const std::string& model);  // SADD + EXPIRE on the next Commit
  bool has_staged() const { return !staged_.empty(); }
  // Something other than removals waits to be written.
  bool has_writes() const { return !staged_.empty() || !updates_.empty() || !models_.empty(); }
  bool idle() const { return !has_writes() && forgotten_.empty(); }
  // Removals waiting, and when the oldest of them was queued (monotonic; 0 when none).
  size_t removals() const { return forgotten_.size(); }
  int64_t oldest_removal_us() const { return oldest_forget_us_; }

  // Writes everything in one round trip (the restaged records up to 1,024 or 16 MiB of them:
  // the rest on the next commits). On failure the staged records are discarded (the
  // caller rejects those jobs with `unavailable`) and, once anything may have been sent, their
  // removals queued: a write that timed out may still land, and its jobs must not come back
  // after a restart (a connection that could not be made sent nothing: no removals). Removals,
  // updates and models are kept for the next try. `find` gives a restaged job by id (the
  // scheduler's), or null when it is no longer pending: its record is then not written (its removal
  // is queued).
  using FindJob = std::function<const Job*(const std::string& id)>;
  Status Commit(const FindJob& find);

  // Reads every journaled job (in acceptance order) and the known models. Jobs whose result is
  // already in Redis (the broker died between the result and the removal) are dropped from the
  // journal instead of returned. A record that does not decode (damaged, or written by a newer
  // broker) goes to *unreadable as (job id, why), for the caller to fail the job (its record is
  // removed with Forget then, as a finished job's); one whose field is not a job id is dropped.
  Status Load(std::vector<std::unique_ptr<Job>>* jobs, std::vector<std::string>* models,
              std::vector<std::pair<std::string, std::string>>* unreadable);

  // The record's encoding, public for tests.
  static std::string Encode(const Job& job);
  static Status Decode(const std::string& bytes, Job* out);

 private:
  protocol::RedisClient* redis_;
  protocol::Keys keys_;
  std::vector<std::pair<std::string, std::string>> staged_;  // id -> record
  std::set<std::string> updates_;                            // ids (Restage)
  std::unordered_set<std::string> forgotten_;
  // Staged ids whose removal Stage took back (the id accepted again): queued again if the
  // commit fails before sending anything, since an earlier write of the id may still land.
  std::vector<std::string> unforgotten_;
  int64_t oldest_forget_us_ = 0;
  std::set<std::string> models_;  // a set: READYs repeat them, and while Redis is down they wait
};

}  // namespace ferry::broker
