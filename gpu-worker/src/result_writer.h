#pragma once
// ResultWriter: the worker's Redis connection and its one thread. Executors (and the I/O thread,
// for jobs that never ran) Submit results; the thread packs each into the result record
// (protocol::PackResult) and writes everything queued in ONE pipelined round trip:
//   SET <prefix>result:<id> <msgpack> EX <ttl> NX     (per job; ttl = the job's result_ttl_s,
//                                                      or the default when 0)
// NX is the fencing: the first final result wins, so a worker presumed dead that comes back
// late, or a result the broker already wrote (expired, cancelled, poisoned), is never
// overwritten; such nil replies are counted as duplicates and reported in DONE. NX also makes a
// retried write harmless. When Redis is unreachable or answers with an error that says to wait
// (LOADING, BUSY, OOM...), the thread keeps the results and retries the round trip with backoff
// (50 ms doubling to 2 s) until it works (each record sends again only what has not gone
// through: its write, notice or DEL). Only then does it hand the batch's DoneReport to the I/O
// thread through the Outbox; so DONE always follows the write. Records of at most
// `inline_result_bytes` that this write stored (SET NX answered OK) travel in the report
// ("results"), for the broker to hand to producers that asked for them: the same bytes as in Redis.
//
// Result notices straight to the producer: a job whose CHUNK entry names a "notify" channel also
// gets PUBLISH <channel> <notice> (a FINISHED body for the job) in the same pipeline, after its
// write. A record of at most inline_result_bytes travels inside the notice, and then the two are
// one script -- SET NX, then, only if that stored it, PUBLISH -- so a notice never carries a
// record that lost to an earlier result. A bigger record goes as SET NX followed by PUBLISH of
// a notice without it (no script: Lua would copy the record in and out, ~1.6 ms of Redis CPU
// per MB); that notice may then follow a losing write, and names an id whose winning result is
// in Redis, or a write Redis refused (it goes with the write's first try only; after that, only
// once the record is stored). At light load the producer has its result one Redis hop after
// the write instead of after DONE and FINISHED travel through the broker. A Redis that refuses
// the script (or PUBLISH) gets plain SETs from then on (logged once).
//
// A job whose inputs the producer stored in Redis (Keys::Input) has them deleted once its result
// is decided (stored, or another found there), never beside the write: with the next batch's
// writes, or at once when idle (a DEL Redis fails to take then waits for the next batch).
//
// Thread-safety: Submit and the accessors from any thread; Start/Stop from one owner.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <msgpack.hpp>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "job.h"
#include "outbox.h"

namespace ferry::worker {

class WorkerMetrics;  // worker_metrics.h

class ResultWriter {
 public:
  struct Options {
    protocol::RedisEndpoint redis;
    std::string prefix = std::string(protocol::kDefaultPrefix);
    int64_t default_ttl_s = protocol::kDefaultResultTtlS;
    std::string worker_name;
    int redis_timeout_ms = 2000;
    int backoff_initial_ms = 50;
    int backoff_max_ms = 2000;
    size_t inline_result_bytes = 16384;  // records up to this size ride in DONE; 0 = none
    WorkerMetrics* metrics = nullptr;    // optional; must outlive the writer
  };

  // `outbox` (where DONE reports go) must outlive the writer.
  ResultWriter(Options options, Outbox* outbox);
  // Abandons what is not written yet (logged) and joins. Call Stop() first to drain.
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;

  // Starts the thread (which connects to Redis, retrying until it can).
  void Start();
  // Queues results for the next round trip. Never blocks on Redis.
  void Submit(std::vector<JobResult> results);
  // Writes and reports everything submitted so far, then joins. Blocks while Redis is down.
  void Stop();

  // Results submitted but not written yet.
  size_t pending() const;
  // Results written so far (all time).
  int64_t written() const;
  // Results that lost the race: another final result was already in Redis (all time).
  int64_t duplicates() const;

 private:
  // One result's commands' arguments, packed once and reused on every retry.
  struct PackedResult {
    std::string key;
    msgpack::sbuffer record;  // the result record (moved, never copied, into the command)
    std::string ttl;
    // What the write did, taken from the first attempt that had a clear answer for this record,
    // whatever the other records of the round got (a retry sends each record only what it
    // still lacks):
    bool tried = false;        // the write was sent
    bool decided = false;      // an attempt got OK or nil for this write
    bool stored = false;       // it stored the record: OK (it is the job's result)
    bool found_there = false;  // it found another record there: nil, and no earlier attempt
                               // can have stored this one
    // An attempt got no clear answer but may have stored the record (its reply was lost, or the
    // notice script failed after its SET): a later nil may be this write's own record, and is
    // then neither stored nor found_there.
    bool may_be_ours = false;
    bool notice_published = false;  // its producer was sent the notice of the stored record
    std::string notify;             // the producer's channel ("" = none): the write also PUBLISHes
    std::string notice;             // what it publishes there
    bool scripted = false;  // the record is inside the notice: SET NX + PUBLISH as one script
    std::vector<std::string> stored_inputs;  // keys of the job's inputs in Redis: DEL once
                                             // the write is decided (OweInputDeletes)
    std::string id, model;                   // for a failure record in its place (below)
    int64_t attempt = 1, batch_size = 0;
    // Redis refused this record for good (an error reply that retrying cannot cure): the text.
    // The writer then stores a failure record in its place, once; if that is refused too, the
    // job is reported without a result (logged with its id).
    std::string refused;
    bool replaced = false;  // `record` is that failure record
    std::string_view value() const { return {record.data(), record.size()}; }
  };

  void Loop();
  // Packs each result into its SET arguments (and releases the outputs' memory).
  std::vector<PackedResult> Pack(std::vector<JobResult>* results) const;
  // One pipelined round trip: the owed DEL (below), then SET NX (or the notice script) and
  // PUBLISH for `packed`; records what each did the first time it is clear, and sends a record
  // only what it still lacks. Fails (to be retried) when any reply says to wait or the
  // connection fails.
  Status WriteOnce(std::vector<PackedResult>* packed);
  // Owes the DEL of the stored inputs of `packed`'s decided records: it goes first in the next
  // round (the next batch's, or one of its own once the writer is idle).
  void OweInputDeletes(const std::vector<PackedResult>& packed);
  // Writes `packed`, retrying with backoff until Redis accepts it or the writer is aborted
  // (returns false only then).
  bool WriteWithRetries(std::vector<PackedResult>* packed);
  bool WriteBatchWithRetries(std::vector<PackedResult>* packed);
  // `p`'s record becomes a failed result (code internal) saying why Redis refused it, written
  // plainly (no notice script), with the job's expiry as the record it replaces.
  void ReplaceWithFailure(PackedResult* p) const;
  // Counts the written batch and hands its DoneReport to the outbox; a job whose record Redis
  // refused (ReplaceWithFailure) counts as failed, a record that found another there as a
  // duplicate.
  void Report(std::vector<JobResult>* batch, std::vector<PackedResult>* packed);
  // Sleeps up to `ms` or until aborted; returns false when aborted.
  bool Backoff(int ms);

  const Options options_;
  const protocol::Keys keys_;
  Outbox* const outbox_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobResult> queue_;  // guarded by mu_
  size_t in_flight_ = 0;          // guarded by mu_: taken by the thread, not yet written
  int64_t written_ = 0;           // guarded by mu_
  int64_t duplicates_ = 0;        // guarded by mu_
  bool stopping_ = false;         // guarded by mu_
  bool aborted_ = false;          // guarded by mu_
  // The thread's own.
  bool scripts_ok_ = true;  // cleared for good when Redis refuses the notice script
  std::unique_ptr<protocol::RedisClient> client_;  // null until connected
  // Keys of stored inputs whose jobs' results are in Redis, not yet deleted (at most
  // kMaxOwedDeletes: past it the oldest are left to expire). The writer thread's.
  static constexpr size_t kMaxOwedDeletes = 1 << 16;
  std::vector<std::string> owed_deletes_;
  std::thread thread_;
};

}  // namespace ferry::worker
