#pragma once
// The broker's private state and handlers, shared by broker.cc (loop, dispatch, heartbeats),
// frontend.cc (producers) and backend.cc (workers). Everything here runs on the broker thread.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "broker_metrics.h"
#include "ferry/broker/broker.h"
#include "ferry/metrics/metrics_server.h"
#include "ferry/metrics/redis_probe.h"
#include "ferry/metrics/registry.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/wire.h"
#include "final_results.h"
#include "journal.h"
#include "log_limiter.h"
#include "orphan_watch.h"
#include "reply_backlog.h"
#include "scheduler.h"
#include "zap_handler.h"

namespace ferry::broker {

struct Broker::Impl {
  explicit Impl(const BrokerOptions& o);

  BrokerOptions options;
  zmq::context_t context{1};
  // With CURVE, the ZAP handler (bound in the context before the sockets bind); else null.
  std::unique_ptr<ZapHandler> zap;
  zmq::socket_t frontend{context, zmq::socket_type::router};
  zmq::socket_t backend{context, zmq::socket_type::router};
  std::unique_ptr<protocol::RedisClient> redis;
  protocol::Keys keys;
  Scheduler scheduler;
  Journal journal;
  FinalResults final_results;
  ReplyBacklog reply_backlog{options.max_inline_backlog_bytes};  // replies queued, in bytes
  // Models without workers (orphan_watch.h); after `options`, which it is built from.
  OrphanWatch orphans{options.orphan_timeout_s, protocol::NowMicros(), options.heartbeat_ms,
                      options.liveness};
  int64_t next_heartbeat_us = 0;
  int64_t next_models_note_us = 0;  // Heartbeat renews <prefix>models hourly (journal on)
  // Restored jobs within a liveness period of their deadline are parked (Restore) until this
  // wall-clock time, counted from the loop's start, for the workers that still run them to
  // claim them (READY "held"); then ExpireJobs expires those no worker claimed. 0: none parked.
  int64_t parked_until_us = 0;
  // The Redis process the journal is in (INFO's run_id), looked at whenever the broker's Redis
  // client opened a new connection (WatchRedisRestart).
  std::string redis_run_id;
  int64_t redis_connects_seen = 0;

  // ACCEPTED replies held until this turn's journal commit.
  struct PendingReply {
    std::vector<zmq::message_t> envelope;
    protocol::Accepted accepted;
    std::vector<int64_t> seqs;  // accepted.ids[i]'s Job::seq: which job of that id it is
    // accepted.ids[i]'s model, for the metrics: the job may end before the reply is sent
    // (cancelled or expired in the turn it was accepted in).
    std::vector<std::string> models;
    bool ack = true;  // false: SUBMIT "ack": false -- no ACCEPTED unless something was rejected
  };
  std::vector<PendingReply> pending_replies;
  // Jobs accepted in this turn that ended in it too (a CANCEL read right after their SUBMIT):
  // their FINISHED waits until CommitAndReply has sent their ACCEPTED, which it never overtakes.
  int64_t first_unreplied_seq = INT64_MAX;  // the first Job::seq accepted in this turn
  std::vector<std::unique_ptr<Job>> held_finished;

  // Warnings about what peers send, rate-limited per kind (a peer can repeat a bad message).
  LogLimiter bad_worker_message_log, bad_producer_message_log, refused_log, redis_log,
      duplicates_log;
  void LimitedWarn(LogLimiter& limiter, const std::string& text);

  // Metrics (broker_metrics.h): kept by hooks in the handlers, served by metrics_server.
  metrics::Registry metrics_registry;
  BrokerMetrics telemetry{&metrics_registry};
  // With metrics: ferry_redis_up and /readyz. Declared before the server, which calls it, so
  // that it is destroyed after the server.
  std::unique_ptr<metrics::RedisProbe> redis_probe;
  std::unique_ptr<metrics::MetricsServer> metrics_server;

  Status Init();
  Status InitCurve();
  // Resolves the Redis endpoint (URL + files) and fails when Redis refuses it (broker.cc).
  Status InitRedis();
  Status Restore();
  // With CURVE: whether a message's sender (its ZAP User-Id, the public key) is still allowed in
  // its role. A key removed by a reload gets nothing (its messages are dropped here). Always
  // true without CURVE.
  bool ProducerAllowed(const protocol::Message& m);
  bool WorkerAllowed(const protocol::Message& m);
  // SIGHUP: re-read the key directories; drop the workers whose key is no longer listed.
  void ReloadKeys();
  Status StartMetricsServer();  // broker_metrics.cc

  // frontend.cc
  void HandleFrontend(protocol::Message& m);
  void HandleSubmit(protocol::Message& m, const msgpack::object& body, int64_t rid);
  void HandleCancel(protocol::Message& m, const msgpack::object& body, int64_t rid);
  void HandleStats(protocol::Message& m, int64_t rid);
  // Commits the journal and sends the held ACCEPTED replies (rejecting with `unavailable` the
  // jobs the journal could not keep). Removals alone are committed only when due (see
  // journal.h) or when `quiet` (this loop turn read nothing).
  void CommitAndReply(bool quiet);
  // Sends a reply to a producer; one it cannot take now is dropped and counted.
  void Reply(const std::vector<zmq::message_t>& envelope, std::string_view command,
             zmq::message_t body);
  void ReplyError(protocol::Message& m, int64_t rid, std::string_view code,
                  std::string_view message);
  // FINISHED to each job's producer, with the inline results of the jobs that asked for them;
  // none for the `notified` jobs (their worker published the notice on the producer's channel).
  void NotifyFinished(const std::vector<std::unique_ptr<Job>>& jobs,
                      const protocol::InlineResults& results,
                      const std::vector<std::string>& notified);

  // backend.cc
  void HandleBackend(protocol::Message& m);
  void HandleReady(protocol::Message& m, const msgpack::object& body);
  void HandleDone(protocol::Message& m, const msgpack::object& body);
  // Finishes the pending jobs among `ids` whose result is in Redis (a DONE from a connection that
  // did not hold them: a worker dropped as silent, or a peer making claims). No inline records;
  // the DONE's `not_done` statuses (for the metrics) and `notified` ids (no FINISHED) hold.
  void FinishIfStored(const std::vector<std::string>& ids, const std::string& from,
                      const protocol::DoneStatuses& not_done,
                      const std::vector<std::string>& notified);
  // Requeues the jobs it held, each with attempt + 1 unless !spend_attempt (they never reached
  // it); those past --max-attempts are poisoned.
  void DropWorker(const std::string& routing_id, const char* why, bool spend_attempt = true);
  // Journal removal + FINISHED (carrying `results`, the DONE's inline results, if any; none
  // for the DONE's `notified` jobs).
  void Finish(std::vector<std::unique_ptr<Job>> jobs, const protocol::InlineResults& results = {},
              const std::vector<std::string>& notified = {});

  // broker.cc
  // Reads and handles what workers sent, at most a turn's worth (messages and time); returns
  // whether it read the socket empty.
  bool ReadBackend();
  void Dispatch();
  // Expires the queued jobs past their deadline, and the parked ones once parked_until_us passed.
  void ExpireJobs();
  // Fails the queued jobs of models without a worker for --orphan-timeout-s (orphan_watch.cc).
  void FailOrphans();
  void FlushFinalResults();
  // With the journal: after the Redis client opened a new connection, asks Redis for its run_id.
  // A new one is a Redis that restarted (or another one, after a failover), which may have lost
  // the journal: every pending job and known model is written to it again on the next commit.
  void WatchRedisRestart();
  // --heartbeat-ms x --liveness: how long a worker that announced no longer interval may stay
  // silent before it is presumed dead (Scheduler::SilentWorkers), and how long jobs a worker
  // may still hold stay parked.
  int64_t LivenessMicros() const { return options.heartbeat_ms * options.liveness * 1000; }
  // Every --heartbeat-ms: drops silent workers, sends HEARTBEATs, renews the models hourly.
  // True when it read workers' messages first (their effects are the next turn's to act on).
  bool Heartbeat(int64_t now_mono);
};

}  // namespace ferry::broker
