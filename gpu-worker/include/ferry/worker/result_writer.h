#pragma once
// ResultWriter: the thread that owns the worker's Redis connection. Executors (and the I/O
// thread, for jobs that never ran) Submit results; the writer packs each into the result record
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
// Thread-safety: Submit/pending may be called from any thread. Start/Stop from one owner.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/util.h"
#include "ferry/worker/job.h"

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
  // Writes and reports everything submitted so far, then joins. Blocks while Redis is down.
  void Stop();

  // Results submitted but not written yet.
  size_t pending() const;
  // Results written so far (all time).
  int64_t written() const;
  // Results that lost the race: another final result was already in Redis (all time).
  int64_t duplicates() const;

 private:
  void Loop();
  // One SET command's arguments, packed once and reused on every retry.
  struct PackedResult {
    std::string key;
    std::string value;  // the result record
    std::string ttl;
    bool stored = false;  // SET NX stored it at the first try (it is the job's result)
  };
  // Packs and writes `results` (into *packed), retrying until Redis accepts them or the writer
  // is aborted. Returns false only on abort.
  // `duplicates` gets how many ids already had a final result (SET NX answered nil).
  bool Write(std::vector<JobResult>* results, std::vector<PackedResult>* packed,
             int64_t* duplicates);
  void SendDone(zmq::socket_t& push, const std::vector<JobResult>& results,
                const std::vector<PackedResult>& packed, int64_t duplicates);
  // Sleeps up to `ms` or until aborted; returns false when aborted.
  bool Backoff(int ms);

  zmq::context_t* context_;
  const Options options_;
  const protocol::Keys keys_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobResult> queue_;
  size_t in_flight_ = 0;  // taken by the thread, not yet written
  int64_t written_ = 0;
  int64_t duplicates_ = 0;
  bool stopping_ = false;
  bool aborted_ = false;
  std::unique_ptr<protocol::RedisClient> client_;  // writer thread only; null until connected
  std::thread thread_;
};

}  // namespace ferry::worker
