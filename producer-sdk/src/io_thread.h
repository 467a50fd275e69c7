#pragma once
// IoThread: the producer SDK's one I/O thread, an actor. It alone owns the DEALER socket to the
// broker's frontend and the Redis subscription on which workers publish result notices. Other
// threads never touch either: they hand it requests through its mailbox (Post) and wait on a
// completion of their own.
//
//   caller threads --Post--> mailbox --> IoThread --SUBMIT/CANCEL/STATS--> broker
//   caller threads <--reply completion-- IoThread <--ACCEPTED/CANCELLED/STATS/ERROR-- broker
//   ResultTracker  <--on_finished-- IoThread <--FINISHED (broker) / notices (Redis Pub/Sub)
//
// Each turn of its loop the thread takes the whole mailbox, sends what the socket takes, then
// sleeps in one poll on the socket, the mailbox's eventfd and the subscription's socket. It is
// woken only by work: a Post while it sleeps, a message, a notice.
//
// Requests carry a request id ("rid") that the broker echoes; the reply goes to the request's
// ReplyFn, on this thread. A request is sent once, and only while a broker is connected (the
// socket is ZMQ_IMMEDIATE: nothing is queued for a broker that is not there), so a request whose
// caller gave up before it went out (Forget) is never delivered to a broker that comes up later.
//
// The broker's limits: the first request on every connection is the thread's own LIMITS, and
// nothing else goes out until the broker has answered it. A SUBMIT bigger than the answer's
// max_message_bytes is then not sent -- a frame over it would make the broker's libzmq drop the
// connection without an answer -- but answered here with ERROR too_large, as the broker answers
// one whose frames add up to more. A lost connection (the socket monitor's DISCONNECTED) makes
// the limits unknown again: the next connection may be to a broker restarted with others.
//
// Result notices (Options::push_results): Subscribe asks the thread to subscribe to a fresh
// channel of its own; it publishes the name (push_channel()) for callers to put into SUBMIT
// ("notify"); each notice there is a FINISHED body. If the subscription fails, notices published
// since are lost and the broker sends no FINISHED for those jobs: on_push_lost runs, and the next
// Subscribe subscribes again, on a new channel, running on_push_lost once more then. After a
// failed attempt Subscribe does nothing for a back-off (1 s doubling to 30 s).
//
// Exceptions out of the callbacks (e.g. std::bad_alloc) are caught on this thread and counted
// (callback_errors()); the notice or reply they were handling is dropped, the thread goes on.
//
// Thread-safety: Post, Forget, Call, NextRid and the accessors from any thread. The callbacks in
// Options and every ReplyFn run on the I/O thread: they must not block or call back into it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <msgpack.hpp>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/curve.h"
#include "ferry/protocol/redis.h"
#include "ferry/protocol/types.h"
#include "ferry/protocol/util.h"
#include "ferry/status.h"

namespace ferry::client {

class IoThread {
 public:
  using Clock = std::chrono::steady_clock;

  struct Reply {
    std::string command;  // e.g. ACCEPTED, STATS, ERROR
    zmq::message_t body;  // msgpack map bytes (unpack with protocol::UnpackMap)
  };
  using ReplyFn = std::function<void(Reply reply)>;
  // The ids of one FINISHED (or one worker notice) and its inline records (views valid during
  // the call only).
  using FinishedFn = std::function<void(const std::vector<std::string>& ids,
                                        const protocol::InlineResults& records)>;

  struct Options {
    std::string frontend;                // the broker's frontend endpoint
    std::string curve_server_public;     // CURVE: the broker's .key; with curve_secret
    std::string curve_secret;            // CURVE: this client's .key_secret
    bool push_results = false;           // subscribe for result notices from workers
    protocol::RedisEndpoint redis;       // where to subscribe
    std::string redis_prefix;            // the notify channel is <prefix>notify:<uuid>
    int redis_timeout_ms = 1000;         // connect timeout of the subscription
    FinishedFn on_finished;              // every FINISHED and every notice
    std::function<void()> on_push_lost;  // notices may have been lost (see above)

    // The limit to keep to when the broker does not answer LIMITS (a broker from before it
    // answers ERROR unknown_command): ClientOptions::max_message_bytes.
    int64_t max_message_bytes = (64 << 20) + (1 << 20);
  };

  // One request in flight: shared by the caller that posted it and the I/O thread.
  class Request;

  // Connects the socket (asynchronously: no broker needs to be up) and starts the thread.
  // invalid_argument when ZeroMQ rejects the endpoint.
  static Status Start(Options options, std::unique_ptr<IoThread>* out);
  // Stops and joins the thread. Replies that have not come are never delivered.
  ~IoThread();
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  // A fresh request id (never 0) to put into the body as "rid".
  int64_t NextRid() { return next_rid_.fetch_add(1) + 1; }

  // Hands [FERRY1, command, body, frames...] to the thread to send (`frames`: the data frames
  // of attached inputs). If a reply whose "rid" equals `rid` comes, `on_reply` gets it on the
  // I/O thread (once), unless Forget came first.
  std::shared_ptr<Request> Post(int64_t rid, std::string_view command, zmq::message_t body,
                                ReplyFn on_reply, std::vector<zmq::message_t> frames = {});
  // The caller no longer wants the reply. Returns true when the request had not been sent (no
  // broker connected): it is dropped and never will be.
  bool Forget(const std::shared_ptr<Request>& request);

  // Post, then wait up to timeout_ms for the reply. unavailable when none came in time (the
  // broker is down, unreachable or overloaded): then *unsent (when given) says whether the
  // request was never sent (no broker connected; it is dropped and never will be, and the
  // message says so) or was sent and may or may not have been handled. *unsent is false
  // whenever a reply came.
  Status Call(int64_t rid, std::string_view command, zmq::message_t body, int timeout_ms,
              Reply* reply, std::vector<zmq::message_t> frames = {}, bool* unsent = nullptr);

  // The current notify channel; empty while there is no working subscription.
  std::string push_channel() const;
  // Whether Subscribe would try now: notices on, no subscription, not backing off.
  bool subscribe_due() const;
  // Has the thread subscribe now (unless subscribe_due() is false by then) and waits until it
  // has tried, or timeout_ms passed; push_channel() says how it went.
  void Subscribe(int timeout_ms);

  // Why the last connection attempt to the broker failed its handshake (a refused CURVE key, a
  // wrong broker key, CURVE on one side only), for error messages; empty once a handshake
  // succeeded or when none failed.
  std::string handshake_error() const;

  // The broker's --max-message-bytes, --max-jobs-per-message and --max-job-bytes, as it answered
  // LIMITS on the current connection; 0 while unknown (no connection yet, or no answer on it
  // yet; a broker from before LIMITS leaves the configured message limit and no job limit).
  int64_t broker_max_message_bytes() const { return broker_max_message_bytes_.load(); }
  int64_t broker_max_jobs_per_message() const { return broker_max_jobs_per_message_.load(); }
  int64_t broker_max_job_bytes() const { return broker_max_job_bytes_.load(); }

  // For tests: turns of the loop (one per wake-up), and exceptions caught from callbacks.
  int64_t loop_turns() const { return loop_turns_.load(); }
  int64_t callback_errors() const { return callback_errors_.load(); }

 private:
  explicit IoThread(Options options);
  void Loop();
  // The thread's own steps; everything below runs on the I/O thread only.
  void TakeMailbox();
  void SendQueued();
  void ReceiveAll();
  void Dispatch(std::string command, zmq::message_t body);
  // A FINISHED body (from the broker, or a worker's notice): its ids and records to on_finished.
  void DeliverFinished(const msgpack::object& body);
  void ReadPush();
  void MaybeSubscribe();
  void DropPush();
  void SweepPending(Clock::time_point now);
  void ReadMonitor();
  bool Writable();
  // Whether LIMITS should go out: not yet sent on this connection, or unanswered for a while
  // with requests waiting behind it.
  bool LimitsDue(Clock::time_point now) const;
  void SendLimits();
  void OnLimits(const std::string& command, const msgpack::object& body);
  // Answers request `r` (`bytes` long) here with ERROR too_large instead of sending it (over
  // the broker's limit), unless its caller forgot it first.
  void RefuseTooLarge(Request& r, size_t bytes);
  template <typename Fn>
  void RunCallback(Fn&& fn);

  const Options options_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;   // the I/O thread's (created before it starts)
  zmq::socket_t monitor_;  // the I/O thread's: handshake events of socket_
  int wake_fd_ = -1;       // eventfd: Post wakes the thread through it
  std::thread thread_;
  std::atomic<int64_t> next_rid_{0};
  std::atomic<int64_t> loop_turns_{0};
  std::atomic<int64_t> callback_errors_{0};

  // The mailbox: the only state shared with callers (besides the published channel).
  std::mutex mailbox_mu_;
  std::vector<std::shared_ptr<Request>> mailbox_;  // guarded by mailbox_mu_
  bool asleep_ = false;  // guarded by mailbox_mu_: the thread is (about to be) in poll
  bool stop_ = false;    // guarded by mailbox_mu_

  // Published for callers by the I/O thread.
  protocol::HandshakeWatch handshake_watch_{false};  // the I/O thread's; set up in Start
  mutable std::mutex handshake_mu_;
  std::string handshake_error_;  // guarded by handshake_mu_: handshake_watch_.error()
  mutable std::mutex channel_mu_;
  std::string channel_;  // guarded by channel_mu_
  std::atomic<bool> subscribed_{false};
  std::atomic<int64_t> push_retry_at_ns_{0};  // steady clock, since its epoch
  std::atomic<int64_t> broker_max_message_bytes_{0};
  std::atomic<int64_t> broker_max_jobs_per_message_{0};
  std::atomic<int64_t> broker_max_job_bytes_{0};

  // The I/O thread's own state.
  protocol::BrokerLimits limits_;         // this connection's; max_message_bytes 0 while unknown
  int64_t limits_rid_ = 0;                // the LIMITS sent on this connection; 0 before it is sent
  Clock::time_point limits_resend_at_{};  // when an unanswered LIMITS goes out again
  int64_t disconnects_seen_ = 0;          // handshake_watch_.disconnects() when last looked
  std::deque<std::shared_ptr<Request>> unsent_;
  std::unordered_map<int64_t, std::shared_ptr<Request>> awaiting_;  // by rid
  std::unique_ptr<protocol::RedisSubscriber> push_;
  bool subscribed_before_ = false;
  int push_backoff_ms_ = 0;
  Clock::time_point next_sweep_{};
};

}  // namespace ferry::client
