#pragma once
// ResultWriter: the worker's Redis connection and its thread. Executors (and the I/O thread, for
// jobs that never ran) Submit results; the writer packs each into the result record
// (protocol::PackResult) and writes everything it has queued in ONE pipelined round trip:
//   SET <prefix>result:<id> <msgpack> EX <ttl> NX     (per job; ttl = the job's result_ttl_s,
//                                                      or the default when 0)
// NX is the fencing: the first final result wins, so a worker presumed dead that comes back
// late, or a result the broker already wrote (expired, cancelled, poisoned), is never
// overwritten; such nil replies are counted as duplicates and reported in DONE. NX also makes a
// retried write harmless. When Redis is unreachable or answers with an error, the
// writer keeps the results and retries the whole round trip with backoff (50 ms doubling to
// 2 s) until it works. Only then does it hand the ids to the I/O thread -- a [command, body]
// message on a PUSH socket connected to `outbox_address` (an inproc PULL the I/O thread binds)
// -- which sends them to the broker as DONE. So DONE always follows the write. Records of at
// most `inline_result_bytes` that this write stored (SET NX answered OK at the first try) also
// travel inside the DONE ("results"), for the broker to hand to producers that asked for them:
// the same bytes as in Redis, so a producer never sees a result that Redis does not hold.
//
// Result notices straight to the producer: a job whose CHUNK entry names a "notify" channel is
// written with a script instead of a plain SET -- SET NX, then, only if that stored it, PUBLISH
// <channel> <notice> (a FINISHED body for the job, the record inside when at most
// inline_result_bytes) -- in the same pipeline. At light load the producer then has its result
// one Redis hop after the write instead of after DONE and FINISHED travel through the broker.
// A Redis that refuses the script gets plain SETs from then on (logged once).
//
// Caller-runs when idle: WriteOrSubmit does the same write on the calling thread (an executor
// with no next batch waiting) when nothing is queued or being written, instead of waking the
// writer thread -- at light load that saves a thread hand-off per batch. Whoever writes holds the
// "writing" role (the Redis connection and the PUSH socket); if the first try on the caller's
// thread fails, the packed results go to the writer thread, which retries them as above. So the
// guarantees are the same on both paths: DONE follows the write, first result wins.
//
// Kept DONEs (Options::hold_notified_ids > 0, as the worker sets it): a DONE whose jobs were all
// notified is not urgent -- its producers already have their notices, and the broker sends them
// nothing -- so instead of handing it to the I/O thread at once, which wakes that thread once per
// batch, the writer keeps its ids (up to hold_notified_ids of them) for BrokerLink to collect
// with TakeHeldDone when it next looks. The link looks on its own wake-ups; only when it sleeps
// with no deadline near enough (SetCollectorAsleep) does the first id kept wake it, with a
// kKeptWake message on the outbox. A DONE that is not all notified, or one that would pass the
// bound, carries the kept ids along, first. At light load that takes most of a context switch
// and a dozen system calls per job off the worker's busiest CPU.
//
// Thread-safety: Submit/WriteOrSubmit/pending/TakeHeldDone may be called from any thread.
// Start/Stop from one owner.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "job.h"

namespace ferry::worker {

class WorkerMetrics;  // src/worker_metrics.h

class ResultWriter {
 public:
  struct Options {
    protocol::RedisEndpoint redis;
    std::string prefix = std::string(protocol::kDefaultPrefix);
    int64_t default_ttl_s = protocol::kDefaultResultTtlS;
    std::string worker_name;
    std::string outbox_address;  // where DONE ids go (the I/O thread's inproc PULL)
    int redis_timeout_ms = 2000;
    int backoff_initial_ms = 50;
    int backoff_max_ms = 2000;
    size_t inline_result_bytes = 16384;  // records up to this size ride in DONE; 0 = none
    size_t hold_notified_ids = 0;  // DONE ids of notified jobs kept for TakeHeldDone; 0 = none
    WorkerMetrics* metrics = nullptr;  // optional; must outlive the writer
  };

  // `context` must outlive the writer.
  ResultWriter(zmq::context_t* context, Options options);
  // Abandons what is not written yet (logged) and joins. Call Stop() first to drain.
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;

  // Starts the thread (which connects to Redis, retrying until it can).
  void Start();
  // Queues results for the next round trip. Never blocks on Redis.
  void Submit(std::vector<JobResult> results);
  // Writes `results` on the calling thread (one round trip, then DONE to the outbox) when the
  // writer is idle and connected; otherwise, or when that one try fails, queues them as Submit
  // does. Blocks for one Redis round trip (each connect, write and read bounded by
  // redis_timeout_ms, so an unresponsive Redis stalls the caller a few times that, once per
  // outage; then the writer is busy retrying and callers queue). Callers must be done before Stop.
  void WriteOrSubmit(std::vector<JobResult> results);
  // Writes and reports everything submitted so far, then joins. Blocks while Redis is down.
  void Stop();

  // The DONE ids kept back (see "Kept DONEs" above); all of them were notified.
  struct HeldDone {
    std::vector<std::string> ids;
    protocol::DoneStatuses not_done;  // those whose status is not "done"
    int64_t since_us = 0;             // monotonic: when the first of them was kept
  };
  // Moves the kept DONE ids into *out; false when none are kept.
  bool TakeHeldDone(HeldDone* out);
  // Monotonic microseconds since the oldest kept DONE id was kept; 0 when none are.
  int64_t held_since_us() const { return held_since_us_.load(); }
  // BrokerLink says whether it sleeps without looking at the kept ids in time (true: the first
  // id kept sends it kKeptWake). It sets this before reading held_since_us() and the writer
  // sets held_since_us before reading this (both sequentially consistent), so one of the two
  // always sees the other.
  void SetCollectorAsleep(bool asleep) { collector_asleep_.store(asleep); }
  // The outbox command that only wakes BrokerLink (it carries nothing).
  static constexpr std::string_view kKeptWake = "KEPT";

  // Results submitted but not written yet.
  size_t pending() const;
  // Results written so far (all time).
  int64_t written() const;
  // Results that lost the race: another final result was already in Redis (all time).
  int64_t duplicates() const;
  // Of written(), those written on a caller's thread by WriteOrSubmit (all time).
  int64_t written_by_callers() const;

 private:
  void Loop();
  // One SET command's arguments, packed once and reused on every retry.
  struct PackedResult {
    std::string key;
    std::string value;  // the result record
    std::string ttl;
    bool stored = false;  // SET NX stored it at the first try (it is the job's result)
    std::string notify;   // the producer's channel ("" = none): the write also PUBLISHes
    std::string notice;   // what it publishes there
  };
  // Results packed for Redis, waiting for the writer thread's retries (a caller's try failed).
  struct PackedBatch {
    std::vector<JobResult> results;
    std::vector<PackedResult> packed;
  };
  // Packs each result into its SET arguments (and releases the outputs' memory).
  std::vector<PackedResult> Pack(std::vector<JobResult>* results) const;
  // One pipelined round trip of SET NX for `packed` (the script that also publishes the notice
  // for jobs with a notify channel, after a PING that puts the notices first). On the first try
  // (`first_try`) records which were stored and counts the nils in *duplicates. Needs the
  // writing role.
  Status WriteOnce(std::vector<PackedResult>* packed, bool first_try, int64_t* duplicates);
  // Writes `packed`, retrying with backoff until Redis accepts it or the writer is aborted
  // (returns false only then). `attempt` is the first try's number (2 after a caller's failed
  // try, so that its nils are not counted as duplicates).
  bool WriteWithRetries(std::vector<PackedResult>* packed, int64_t attempt, int64_t* duplicates);
  // Counts the written batch and hands its ids to the I/O thread. Needs the writing role.
  void Report(const std::vector<JobResult>& results, const std::vector<PackedResult>& packed,
              int64_t duplicates, bool by_caller);
  void SendDone(const std::vector<JobResult>& results, const std::vector<PackedResult>& packed,
                int64_t duplicates);
  // Sleeps up to `ms` or until aborted; returns false when aborted.
  bool Backoff(int ms);

  zmq::context_t* context_;
  const Options options_;
  const protocol::Keys keys_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobResult> queue_;
  // A caller's failed try, for the writer thread (one at most: callers write only while empty).
  std::optional<PackedBatch> retry_;
  size_t in_flight_ = 0;  // taken by a writer (thread or caller), not yet written
  int64_t written_ = 0;
  int64_t written_by_callers_ = 0;
  int64_t duplicates_ = 0;
  bool stopping_ = false;
  bool aborted_ = false;
  // The writing role: whoever set it (the writer thread or one caller) alone uses client_ and
  // push_; taking and releasing it under mu_ orders their use across threads.
  bool writing_ = false;
  // Cleared for good when Redis answers the notice script with an error (EVAL not allowed).
  std::atomic<bool> scripts_ok_{true};
  std::unique_ptr<protocol::RedisClient> client_;  // null until connected
  std::unique_ptr<zmq::socket_t> push_;            // to the outbox; null if it could not connect
  // Kept DONE ids (Options::hold_notified_ids): added by whoever writes, taken by BrokerLink.
  std::mutex held_mu_;
  HeldDone held_;                            // guarded by held_mu_
  std::atomic<int64_t> held_since_us_{0};    // held_.since_us, or 0 when held_ is empty
  std::atomic<bool> collector_asleep_{false};  // see SetCollectorAsleep
  std::thread thread_;
};

}  // namespace ferry::worker
