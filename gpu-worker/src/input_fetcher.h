#pragma once
// InputFetcher: the worker's thread that reads stored job inputs from Redis. A job whose inputs
// the producer put in Redis (protocol "stored" tensors, Keys::Input) comes in its CHUNK without
// their bytes; the I/O thread hands such jobs here instead of to the JobQueue. Each turn the
// thread takes the jobs waiting, in order, up to kMaxTurnBytes of declared stored inputs (a
// bigger job alone), reads all their stored inputs with one pipelined round trip (one GET per
// input) into one buffer per model, every job's input 0 back to back, then every job's input 1,
// ..., points each job's inputs at their bytes (the job's `chunk` then shares its model's
// buffer, beside the received message) and pushes the jobs to the JobQueue, so the executors
// find them ready while they compute the batch before. A batch of jobs fetched together thus
// finds its inputs already stacked, which a model on the CPU reads in place (model.cc). A
// buffer lives until the last job of its model and fetch is computed.
//
// A stored input that is not in Redis (it expired before the job ran, or an earlier attempt of
// the job finished and deleted it), whose size is not what its dtype and shape say (the value
// is then skipped on its way from the socket, never held), or that Redis refuses to read
// (WRONGTYPE, NOPERM: invalid_argument, quoting Redis) fails that job (not_found /
// invalid_argument, through the ResultWriter); so does a buffer that cannot be allocated
// (internal), and any exception in a turn fails that turn's jobs (internal): none leaves the
// thread. The others go on. While Redis is unreachable, or answers with an error that goes away
// by itself (LOADING, BUSY, ...: IsTransientRedisError), the jobs wait and the read is retried
// with backoff (50 ms doubling to 2 s); jobs submitted later wait behind them.
//
// The broker's CANCEL reaches jobs here too (Cancel): a job still waiting is failed `cancelled`
// at once, one being read is failed `cancelled` when its read ends instead of going to the queue.
// Jobs go to the queue under the same lock as Cancel, so a job Cancel misses is in the queue by
// the time Cancel returns, where JobQueue::Remove finds it. The broker may send a job again to a
// worker that still holds it (it presumed the worker dead, or the worker reconnected, and
// requeued the job with attempt + 1; the id stays the same): Cancel drops every copy here.
//
// Thread-safety: Submit, Cancel, pending and reading from any thread; Start/Stop from one owner.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "job.h"
#include "job_queue.h"
#include "result_writer.h"

namespace ferry::worker {

class InputFetcher {
 public:
  struct Options {
    protocol::RedisEndpoint redis;
    std::string prefix = std::string(protocol::kDefaultPrefix);
    int redis_timeout_ms = 2000;
    int backoff_initial_ms = 50;
    int backoff_max_ms = 2000;
    // How long Stop keeps retrying while Redis is unreachable before it gives up.
    int stop_timeout_ms = 10000;
  };

  // The declared stored bytes one turn takes at most (a single bigger job goes alone): bounds
  // what a turn allocates before any value is read.
  static constexpr uint64_t kMaxTurnBytes = uint64_t{256} << 20;

  // `queue` and `writer` must outlive the fetcher.
  InputFetcher(Options options, JobQueue* queue, ResultWriter* writer);
  // Abandons what is not fetched yet (logged) and joins. Call Stop() first to drain.
  ~InputFetcher();
  InputFetcher(const InputFetcher&) = delete;
  InputFetcher& operator=(const InputFetcher&) = delete;

  void Start();
  // Queues jobs with stored inputs. Never blocks on Redis.
  void Submit(std::vector<Job> jobs);
  // Fetches what is queued (retrying while Redis is down), then joins. Redis still unreachable
  // after Options::stop_timeout_ms: what is not fetched yet is abandoned (logged). Idempotent.
  void Stop();

  // Drops the jobs of `ids` that are here: waiting ones are failed `cancelled` (to the writer)
  // now, ones being read when their read ends. Returns how many it drops. Call it before
  // JobQueue::Remove with the same ids.
  size_t Cancel(const std::vector<std::string>& ids);

  // Jobs handed in and not yet passed on (to the queue, or failed to the writer).
  size_t pending() const;
  // Of those, the ones being read now (the rest wait for their turn).
  size_t reading() const;

 private:
  void Loop();
  // One pipelined round trip for every stored input of `jobs`; passes on each job it can settle
  // (to the queue, or failed to the writer) and leaves in *jobs those to retry: all of them on a
  // transport failure, those with a transient error reply. Returns why they are left (ok: none).
  Status FetchOnce(std::vector<Job>* jobs);
  // FetchOnce, with an exception failing every job in *jobs (internal) instead of escaping.
  Status FetchOrFail(std::vector<Job>* jobs);
  // Sleeps up to `ms` or until aborted; returns false when aborted.
  bool Backoff(int ms);
  // With mu_ held: moves the jobs of *jobs that Cancel marked into *cancelled (as results).
  void TakeCancelledLocked(std::vector<Job>* jobs, std::vector<JobResult>* cancelled);
  // With mu_ held: `jobs` are the ones being read now (after a take or an attempt). The one
  // writer of in_flight_ and in_flight_ids_, and the one place where marks of ids no longer here
  // go.
  void SetInFlightLocked(const std::vector<Job>& jobs);

  const Options options_;
  const protocol::Keys keys_;
  JobQueue* const queue_;
  ResultWriter* const writer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job> waiting_;                               // guarded by mu_
  size_t in_flight_ = 0;                                   // guarded by mu_
  std::unordered_map<std::string, size_t> in_flight_ids_;  // guarded by mu_: id -> copies read
  std::unordered_set<std::string> cancelled_;      // guarded by mu_: of those, the cancelled
  bool stopping_ = false;                          // guarded by mu_
  bool aborted_ = false;                           // guarded by mu_
  bool finished_ = false;                          // guarded by mu_: Loop has ended
  std::condition_variable finished_cv_;            // notified when finished_ is set
  std::unique_ptr<protocol::RedisClient> client_;  // the thread's own
  std::thread thread_;
};

}  // namespace ferry::worker
