#pragma once
// ferry::client::Client -- the producer SDK: submit inference jobs to a Ferry broker and read
// their results by id.
//
//   std::unique_ptr<ferry::client::Client> client;
//   ferry::Status s = ferry::client::Client::Create(options, &client);
//   ferry::client::Job job;
//   job.model = "resnet";
//   job.inputs.push_back(
//       ferry::Tensor::From<float>(pixels, {3, 224, 224}, ferry::DType::kFloat32));
//   std::string id;
//   s = client->Submit(job, &id);              // accepted, or the rejection's code
//   ferry::Result result;
//   s = client->Wait(id, 10000, &result);      // result.state: kDone / kFailed / ...
//   s = client->Run(job, 10000, &result);      // the same in one call (no ACCEPTED travels)
//
// Jobs travel to the broker's frontend over ZeroMQ (SUBMIT -> ACCEPTED); results are read from
// Redis (<prefix>result:<id>), where workers write them. Wait() does not busy-poll: the broker
// tells this client (FINISHED) when a job it submitted has its result -- with the result record
// inside when it is small (up to the worker's --inline-result-bytes, 16 KiB by default), so
// Wait returns it without reading Redis -- and a slow re-check of Redis covers notices that
// were lost (a broker restart) and jobs submitted by another process. At light load the worker
// also publishes each result notice on this client's Redis channel (push_results), which
// arrives sooner than the broker's.
//
// Errors: every method returns a ferry::Status; nothing throws (an exception inside, e.g.
// std::bad_alloc, comes back as `internal`). Codes (ferry::codes):
//   invalid_argument  the caller's input is wrong (bad id, empty model, tensor size mismatch)
//   unknown_model, duplicate, too_large   the broker rejected a job
//   queue_full, unavailable   retryable: back off and submit again with the SAME ids (a job the
//                     broker already holds is then rejected as duplicate, so nothing runs twice)
//   timeout           Wait() ran out of time
//   malformed, internal   a bug or a peer speaking another protocol version
//
// Cancellation: Cancel(id) asks the broker to drop a job. A queued job gets the final result
// "cancelled" at once; a job already sent to a worker is dropped there if its batch has not
// started (then it too ends "cancelled"), else it runs and its result stands.
//
// Thread-safety: a Client is safe to share: any number of threads may call any method at once.
// Inside, one I/O thread owns the broker socket and the Redis subscription; a calling thread
// hands it its request and sleeps until the reply or its result comes. Wait and Poll read Redis
// on the calling thread, over a small pool of connections. Create the Client before and destroy
// it after all those calls. Ferry's value types (Job, Result, Tensor, Status) are plain values.
//
// Public header: includes only the standard library and Ferry's value types.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/result.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::client {

struct ClientOptions {
  // The defaults below, each replaced by its environment variable where that is set and not
  // empty -- the names `ferry up --env-file` writes and the Python client reads:
  //   FERRY_FRONTEND -> frontend              FERRY_REDIS -> redis
  //   FERRY_REDIS_PREFIX -> redis_prefix      FERRY_REDIS_PASSWORD_FILE -> redis_password_file
  //   FERRY_CURVE_SERVER_PUBLIC -> curve_server_public   FERRY_CURVE_SECRET -> curve_secret
  //   FERRY_REDIS_TLS_CA / _CERT / _KEY -> redis_tls_ca / _cert / _key
  //   FERRY_MAX_MESSAGE_BYTES -> max_message_bytes
  // The Redis files apply only where they can: the TLS ones to a rediss:// `redis`, the password
  // file to a `redis` without a password (as in the Python client). Set fields after this call
  // to override. Create itself never reads the environment: a ClientOptions{} is the plain
  // defaults. docs/operations.md ("Environment variables") lists every variable.
  static ClientOptions FromEnvironment();

  // The broker's frontend (ZeroMQ endpoint).
  std::string frontend = "tcp://127.0.0.1:5555";
  // CurveZMQ (docs/security.md), for a broker started with --curve-secret: the broker's public
  // certificate (its NAME.key) and this client's secret certificate (NAME.key_secret, whose
  // NAME.key is in the broker's --allow-producers). Both or neither; files as `ferry keygen`,
  // czmq or pyzmq write them. When the broker refuses the key, or the broker's key is wrong,
  // calls fail with `unavailable` and a message that says so.
  std::string curve_server_public;
  std::string curve_secret;
  // Where results are read: redis://[USER[:PASSWORD]@]HOST:PORT[/DB], rediss://... for TLS, or
  // unix://[USER[:PASSWORD]@]/PATH[?db=N] for Redis's Unix-domain socket on this host
  // (docs/security.md). With a password every connection starts with AUTH (an ACL user: the
  // deploy/redis/users.acl "ferry-producer"). A Redis that refuses the credentials, the TLS
  // certificate or the database makes the calls that read Redis fail with `unavailable`, and a
  // message that says so (naming the user, never the password); Create does not connect.
  std::string redis = "redis://127.0.0.1:6379";
  // The password, read from this file (one line) by Create, instead of from `redis`: keeps it
  // out of URLs that get logged and out of command lines. Not both.
  std::string redis_password_file;
  // rediss:// only: CA certificates (PEM file) that verify Redis's certificate (default: the
  // system's), and a client certificate and its private key (PEM files, both or neither) for a
  // Redis with tls-auth-clients. Create fails with invalid_argument when they do not load.
  std::string redis_tls_ca;
  std::string redis_tls_cert;
  std::string redis_tls_key;
  // Prefix of every Ferry key in Redis; must match the broker's and workers'.
  std::string redis_prefix = "ferry:";
  // How long Submit/SubmitMany/Stats wait for the broker's answer, and the Redis connect/read
  // timeout. Past it a call fails with `unavailable`.
  int request_timeout_ms = 5000;
  // Light-load latency: while this client tracks at most 64 jobs (submitted, not yet waited
  // for; a SUBMIT's own included), ask the worker to PUBLISH each result notice on this client's
  // own Redis channel (<prefix>notify:<uuid>), which the client subscribes to, so that Wait
  // returns one Redis hop after the result is written instead of after the worker -> broker ->
  // producer notices (the broker then sends none for those jobs). If the subscription fails,
  // waiting jobs are read from Redis and a later Submit subscribes again. false: broker notices
  // only, no subscription.
  bool push_results = true;
  // Big inputs go to Redis, not through the broker (a claim check): an input tensor of at least
  // this many bytes is written by the client itself to <prefix>input:<id>:<index> -- one
  // pipelined round trip per SUBMIT, on the calling thread, before the SUBMIT -- and the SUBMIT
  // carries only its dtype and shape. The worker reads it from Redis and deletes it with the
  // job's result; the client deletes the inputs of jobs the broker rejects (but `duplicate`,
  // whose keys are the pending job's, and `unavailable`: such a job may already be on a worker;
  // those expire after input_ttl_s) and, under ids it made, of a SUBMIT it never sent (no
  // broker connected) or that was refused whole (too_large). So the broker never touches those
  // bytes, and its journal stays small. 0: every input travels in the SUBMIT.
  int64_t stored_input_bytes = 64 * 1024;
  // Inputs that are not stored but have at least this many bytes travel through the broker in
  // ZeroMQ frames of their own after the SUBMIT's body (docs/protocol.md, "Attached inputs"):
  // the client copies each once, into its frame; the broker holds and forwards the frames to
  // the worker without copying or parsing them, and the worker computes from them in place.
  // Smaller ones travel inside the body. 0: every input that is not stored goes in the body.
  int64_t attached_input_bytes = 16 * 1024;
  // The most a SUBMIT may carry in its body and data frames, as this client sees it (the
  // broker's default --max-message-bytes here). A job whose inputs that are not stored need
  // more is too_large here, before anything is sent. The broker's own limit applies too: the
  // client asks it (LIMITS) first thing on each connection and refuses a SUBMIT over it with
  // too_large instead of sending it (a frame over it would make the broker drop the connection
  // without an answer); SubmitMany splits under both once the broker has answered. Set this to
  // the broker's value where that is higher; store big inputs (stored_input_bytes) to send
  // bigger jobs. At least 1024.
  int64_t max_message_bytes = (64 << 20) + (1 << 20);
  // Expiry of stored inputs: a job that has not run within it fails (not_found) when it does.
  int64_t input_ttl_s = 3600;
  // Results that Wait and Run return are deleted from Redis soon after, so Redis does not keep
  // them until their result_ttl_s: for a producer that reads each result once, and for big
  // results (Redis then reuses their memory instead of growing; 1 MB results came back 1.5x as
  // fast in audio_out). One read from Redis is deleted (DEL) right after it came whole, never
  // before: a read cut off (a timeout, a dropped connection) deletes nothing, and the next Wait
  // gets the result. Small results that came inside notices (no Redis read needed) are deleted
  // by a background thread in batches (one DEL for all those returned since its last round
  // trip; best effort: ones it cannot delete -- Redis unreachable, over 100,000 queued, still
  // queued when ~Client has made its one last round trip -- expire with their result_ttl_s, and
  // a Poll right after may still find one). A later Poll or Wait of the id finds no result
  // (kPending). The producer's ACL user needs DEL on results
  // (deploy/redis/users.acl); one with GETDEL only works too, with each value sent back once
  // more. Poll never deletes. Covers Wait and Run; docs/operations.md ("Result retention and
  // Redis sizing") says when to use it.
  bool consume_results = false;
};

// One inference job. `inputs` are the positional arguments of the model's forward(), each
// WITHOUT the batch dimension (the worker stacks jobs into batches).
struct Job {
  std::string id;     // empty: the SDK makes a UUIDv4. Else 1-128 chars of [A-Za-z0-9._:-].
  std::string model;  // a model some worker serves
  std::vector<Tensor> inputs;
  int64_t priority = 0;      // higher runs first
  int64_t timeout_ms = 0;    // 0: none; else the job expires if not started in time
  int64_t result_ttl_s = 0;  // 0: the broker's default (--result-ttl-s, 600 s)
};

// The fate of one job of a SubmitMany call.
struct SubmitOutcome {
  std::string id;  // the job's id (generated when Job::id was empty)
  Status status;   // ok: accepted. Else the rejection: code + message.
};

// What the broker did with the ids of one Cancel call.
struct CancelReport {
  std::vector<std::string> cancelled;  // were queued: their result is now "cancelled"
  // Not final yet, the result tells: were on a worker (dropped there if not started yet), or
  // were queued while Redis did not take their `cancelled` result (docs/protocol.md, CANCEL).
  std::vector<std::string> running;
  std::vector<std::string> not_found;  // not pending: unknown, already finished, or expired
};

class Client {
 public:
  // Makes a client and starts its background I/O thread. Fails with invalid_argument on bad options
  // (an endpoint ZeroMQ cannot parse, a bad Redis URL, a Redis password or TLS file that cannot be
  // read or loaded). Does NOT wait for the broker or Redis: both
  // are connected lazily and reconnected after failures, so a service may start first.
  // On success stores the client in *out (the caller owns it).
  static Status Create(const ClientOptions& options, std::unique_ptr<Client>* out);

  // Stops and joins the background I/O thread; unsent requests are dropped. No other call may be
  // running.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Submits one job. Sets *id (when non-null) to the job's id -- also when the job is rejected,
  // so the caller can retry with it. Returns ok when the broker accepted the job; the rejection
  // (e.g. unknown_model, duplicate, queue_full) otherwise; unavailable when the broker did not
  // answer within request_timeout_ms (the job may or may not have been accepted: resubmit the
  // same id). The job is copied; the caller keeps ownership.
  Status Submit(const Job& job, std::string* id);

  // Submits many jobs in one SUBMIT message -- one round trip -- per 32 MiB of tensor data (or
  // max_message_bytes or the broker's --max-message-bytes, if less) and per 10,000 jobs (or the
  // broker's --max-jobs-per-message, if less; the broker's limits as its LIMITS answer gave them,
  // once this client has had one: a SUBMIT split before that and refused whole for being over
  // them is split again under them and sent). *outcomes gets one entry per job, in order. Jobs
  // that fail local validation get invalid_argument (too_large: over max_message_bytes, over the
  // broker's --max-job-bytes once LIMITS gave it, or a stored input over 512 MiB) and are not
  // sent, their inputs not stored; a job over the broker's --max-message-bytes by itself gets
  // too_large and is not sent, while the others go; two jobs with the same id in one call: the
  // later ones get duplicate. Returns ok when the broker answered (look at each outcome);
  // otherwise the failure (unavailable, malformed, ...), which is also copied into the outcome
  // of every job that was, or after it would have been, sent. The jobs are copied; the caller
  // keeps them.
  Status SubmitMany(const std::vector<Job>& jobs, std::vector<SubmitOutcome>* outcomes);

  // Reads the result of `id` from Redis once, without waiting. When no result exists yet,
  // returns ok with out->state == JobState::kPending (Redis cannot tell "pending" from "never
  // submitted" or "result expired"). Errors: invalid_argument (bad id), unavailable (Redis down),
  // malformed/invalid_argument (a record that is not a Ferry result). *out is overwritten.
  Status Poll(const std::string& id, Result* out);

  // Waits until `id` has a result and stores it in *out (state kDone, kFailed, kCancelled or
  // kExpired). timeout_ms < 0 waits without limit; 0 checks once. Returns timeout when the time
  // runs out (out->state is then kPending), also while a Redis read is still going at the
  // deadline (each read is bounded by the time left: a stalled Redis holds a Wait no longer);
  // unavailable when Redis stayed unreachable until the deadline; other Poll errors at once. Wakes
  // as soon as the broker's FINISHED notice arrives for jobs submitted through this client;
  // otherwise re-checks Redis every 50 ms, backing off to every 1 s. For a job this client
  // submitted whose notice has not come yet the first check is the 50 ms one (the notice says when
  // to read), or halfway to the deadline if that is sooner (a notice may have been lost), except
  // with timeout_ms == 0.
  Status Wait(const std::string& id, int timeout_ms, Result* out);

  // Submit + Wait in one call, for a caller that wants the result now (a request handler): the
  // SUBMIT asks the broker not to confirm acceptance ("ack": false), so no ACCEPTED travels and
  // this thread is woken once per job, by the result, instead of twice. Rejections still come
  // back. Sets *id (when non-null) to the job's id. Returns:
  //   - like Wait once the job has a result (ok; out->state kDone, kFailed, kCancelled, kExpired);
  //   - this submission's rejection, as Submit would (invalid_argument, unknown_model, too_large,
  //     queue_full, unavailable) -- except duplicate: a job with this id is still pending (e.g.
  //     an earlier Run of it that timed out, or another producer's job with the same id), so Run
  //     waits for that job's result instead;
  //   - unavailable "... it was not sent" when no broker took the SUBMIT within timeout_ms;
  //     unavailable when Redis stayed unreachable (as Wait);
  //   - timeout (out->state kPending) otherwise: the broker may or may not have the job (Run
  //     cannot tell a slow job from a SUBMIT lost with a crashed broker) -- Run again with the
  //     same id: a result that came meanwhile is returned without sending anything, a pending
  //     job is waited for. (A job that finished and whose result this client did not see is run
  //     again; its first result stands -- SET NX -- and is the one returned.)
  // timeout_ms bounds the whole call, the storing of big inputs in Redis included (but the first
  // subscription to notices, at most 1 s, and the deletion of the stored inputs of a job no
  // broker took, which a stalled Redis may hold up to 100 ms longer). It must not be 0
  // (invalid_argument; use Poll to check once); < 0 waits without limit, which a SUBMIT lost with
  // its broker turns into forever: prefer a bound and a retry. The job is copied; the caller keeps
  // ownership.
  Status Run(const Job& job, int timeout_ms, Result* out, std::string* id = nullptr);

  // Cancels jobs (one CANCEL message, one round trip, per 10,000 ids, or per the broker's
  // --max-jobs-per-message and --max-message-bytes when lower) and says what happened to each id.
  // Errors: invalid_argument (a bad id; nothing is sent), unavailable (no answer in time).
  Status CancelMany(const std::vector<std::string>& ids, CancelReport* report);
  // Cancels one job: ok when it was queued or running (see CancelReport), not_found when the
  // broker does not hold it (unknown, finished or expired).
  Status Cancel(const std::string& id);

  // Asks the broker for its statistics (workers, queue depth per model, counters) and stores
  // them as a JSON object in *json. Fails with unavailable when the broker does not answer.
  Status Stats(std::string* json);

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::client
