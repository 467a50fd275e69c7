#pragma once
// BrokerLink: the worker's I/O thread. It alone owns the DEALER socket connected to the
// broker's backend ROUTER (ZeroMQ sockets are not thread-safe) and polls it together with the
// Outbox's eventfd, through which the result writer hands it DONE reports and the worker asks
// it to re-announce.
//
//   -> READY      at start and on every REANNOUNCE: name, device, host, pid, capacity, models,
//                 and "held": the ids of the jobs received and not yet in a DONE sent (so that
//                 a restarted broker leaves them here); again when the Outbox asks (the
//                 resident models changed)
//   <- CHUNK      decoded in place (reference mode; the message stays alive while any job
//                 points into it), jobs pushed to the JobQueue -- those with inputs stored in
//                 Redis to the InputFetcher first; entries that fail to decode but carry an id
//                 become failed results (invalid_argument) -- never dropped
//   <- CANCEL     {"ids"}: jobs still in the JobQueue are removed and get a "cancelled"
//                 result; jobs an executor already took run to the end (their result loses
//                 to the broker's if it wrote one first -- fencing)
//   -> DONE       encoded here from the DoneReports the result writer puts in the Outbox once
//                 their results are in Redis
//   <-> HEARTBEAT sent every heartbeat interval; the time of the broker's last message is kept.
//                 A broker silent for heartbeat x liveness is presumed dead (Paranoid Pirate):
//                 the link closes the socket, opens a new one and announces itself again,
//                 backing off from one heartbeat interval to 32 s while the broker stays away.
//   -> BYE        after a drain: on RequestDrain the link stops re-announcing, waits until every
//                 job it received has been reported, sends the held DONEs as one with "bye" (the
//                 broker removes the worker as it finishes them) and BYE, and returns.
//
// Holding DONEs happens here and only here:
//   - while draining, every DONE is held and sent at the end, so that the broker gets no credit
//     back and sends no new work; the drain therefore ends after at most `capacity` jobs;
//   - a DONE whose jobs were all "notified" (their producers got the result notice straight
//     from Redis, so the broker sends them no FINISHED) is not urgent: it is held for up to
//     Options::done_hold_us and coalesced with the next ones, while at most capacity / 4 ids are
//     held (a DONE that is not all notified, or one past that bound, sends the held ones first).
//     At light load that keeps the broker's DONE work off the next job's path.
//
// Thread-safety: Start/Join from the owner; RequestDrain and the accessors from any thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/curve.h"
#include "ferry/protocol/types.h"
#include "ferry/protocol/wire.h"
#include "input_fetcher.h"
#include "job_queue.h"
#include "outbox.h"
#include "result_writer.h"

namespace ferry::worker {

class BrokerLink {
 public:
  struct Options {
    std::string endpoint;             // the broker's backend, tcp://HOST:5556
    std::string curve_server_public;  // CURVE: the broker's .key (with curve_secret)
    std::string curve_secret;         // CURVE: this worker's .key_secret
    protocol::WorkerHello hello;      // what READY says
    // When set, READY says what this returns instead (called on the link's thread): the
    // worker's current resident models. Outbox::RequestReady asks to re-announce now (ignored
    // while draining).
    std::function<protocol::WorkerHello()> hello_fn;
    int64_t heartbeat_ms = 1000;
    int64_t liveness = 3;         // heartbeats the broker may miss before we reconnect
    int64_t done_hold_us = 1000;  // how long DONEs of notified jobs may wait; 0 = not at all
  };

  // Everything passed in must outlive the link. Jobs with stored inputs go to `fetcher`, which
  // reads them from Redis and queues them (null: such jobs fail, internal).
  BrokerLink(zmq::context_t* context, Options options, JobQueue* queue, ResultWriter* writer,
             Outbox* outbox, InputFetcher* fetcher = nullptr);
  ~BrokerLink();  // joins (a link that was started must be drained first)
  BrokerLink(const BrokerLink&) = delete;
  BrokerLink& operator=(const BrokerLink&) = delete;

  // Connects to the broker, queues READY and starts the thread. Fails with kInvalidArgument
  // when the endpoint is malformed.
  Status Start();
  // Asks the thread to drain, send BYE and end. Idempotent.
  void RequestDrain() { drain_requested_.store(true); }
  // Waits until the thread has sent BYE.
  void Join();

  // Wall-clock microseconds of the last message from the broker (0: none yet).
  int64_t last_broker_message_us() const { return last_broker_us_.load(); }
  // How long the broker may stay silent before it is presumed dead: liveness heartbeats of
  // this worker's interval, or of the broker's when its HEARTBEATs say a longer one.
  int64_t SilenceMicros() const {
    return options_.liveness * std::max(options_.heartbeat_ms, broker_heartbeat_ms_.load()) * 1000;
  }
  // Why the broker refused this worker's last READY ("" while it is taken: no READY refused
  // since the last CHUNK or HEARTBEAT, which a broker sends only to workers it took).
  std::string refusal() const {
    std::lock_guard<std::mutex> lock(refusal_mu_);
    return refusal_;
  }
  // Jobs received and not yet reported by the result writer.
  int64_t outstanding() const { return outstanding_.load(); }
  // Whether the thread has seen RequestDrain and is draining.
  bool draining() const { return draining_.load(); }

  // How many DONE ids of notified jobs may wait, for a worker of this capacity.
  static size_t HeldIdsBound(int64_t capacity) {
    return static_cast<size_t>(std::max<int64_t>(capacity / 4, 0));
  }

 private:
  void Loop();
  void HandleBroker(protocol::Message* m);
  void HandleChunk(zmq::message_t body, std::vector<zmq::message_t> frames);
  void HandleCancel(const zmq::message_t& body);
  // Sets last_refusal_ and what refusal() says.
  void SetRefusal(std::string why);
  // The Outbox's reports and READY request.
  void TakeOutbox();
  void HandleReport(DoneReport report);
  void SendReady();
  // Replaces the DEALER with a fresh one and re-announces (after a silent broker).
  void Reconnect();
  void MaybeReconnect(int64_t now_us);
  // A DEALER to the broker with CURVE keys (if any) and a handshake monitor (monitor_).
  Status Connect(std::unique_ptr<zmq::socket_t>* out);
  // What the monitor said about failed handshakes since the last call ("" if nothing).
  std::string HandshakeFailure();
  void Send(std::string_view command, zmq::message_t body);
  // True when a send would not block (the broker is connected or the queue has room).
  bool Writable();
  void Hold(DoneReport report);
  // `bye`: the drain's last DONE (see protocol.md): the broker removes this worker with it.
  void SendHeld(bool bye = false);
  void SendDone(const DoneReport& report, bool bye = false);

  zmq::context_t* context_;
  const Options options_;
  JobQueue* queue_;
  ResultWriter* writer_;
  Outbox* outbox_;
  InputFetcher* fetcher_;
  std::unique_ptr<zmq::socket_t> dealer_;
  std::unique_ptr<zmq::socket_t> monitor_;  // handshake events of dealer_ (the loop thread's)
  protocol::HandshakeWatch handshake_watch_{!options_.curve_secret.empty()};
  int64_t monitors_ = 0;  // for unique monitor endpoints

  std::atomic<bool> drain_requested_{false};
  std::atomic<int64_t> last_broker_us_{0};
  std::atomic<int64_t> broker_heartbeat_ms_{0};  // what the broker's HEARTBEATs say (0: nothing)
  std::atomic<int64_t> outstanding_{0};
  std::atomic<bool> draining_{false};  // written by the loop thread only
  // The loop thread's own.
  bool broker_silent_ = false;  // for one log line per silence
  std::string last_refusal_;    // the broker's last ERROR: logged once; "" once taken
  mutable std::mutex refusal_mu_;
  std::string refusal_;  // last_refusal_ for other threads (refusal()), guarded by refusal_mu_
  // Ids received in CHUNKs and not yet in a DONE sent, with how many copies (a broker may send
  // a job again while the worker still holds it): READY's "held".
  std::unordered_map<std::string, int> held_ids_;
  DoneReport held_;                    // held DONEs, merged (see "Holding DONEs" above)
  int64_t hold_until_us_ = 0;          // monotonic; when notified DONEs held outside a drain go out
  int64_t reconnect_interval_us_ = 0;  // current backoff
  int64_t next_reconnect_us_ = 0;      // wall clock
  int64_t reconnects_ = 0;
  int64_t chunks_ = 0;
  int64_t jobs_ = 0;
  std::thread thread_;
};

}  // namespace ferry::worker
