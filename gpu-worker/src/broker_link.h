#pragma once
// BrokerLink: the worker's I/O thread. It alone owns the DEALER socket connected to the
// broker's backend ROUTER (ZeroMQ sockets are not thread-safe) and polls it together with an
// inproc PULL socket (the "outbox") through which other threads hand it messages to send.
//
//   -> READY      at start and on every REANNOUNCE: name, device, host, pid, capacity, models
//   <- CHUNK      decoded in place (reference mode; the message stays alive while any job
//                 points into it), jobs pushed to the JobQueue; entries that fail to decode but
//                 carry an id become failed results (invalid_argument) -- never dropped
//   <- CANCEL     {"ids"}: jobs still in the JobQueue are removed and get a "cancelled"
//                 result; jobs an executor already took run to the end (their result loses
//                 to the broker's if it wrote one first -- fencing)
//   -> DONE       forwarded from the outbox: the ResultWriter sends ids once they are in Redis
//                 (or collected from the ResultWriter: the DONE ids of notified jobs it kept)
//   <-> HEARTBEAT sent every heartbeat interval; the time of the broker's last message is kept.
//                 A broker silent for heartbeat x liveness is presumed dead (Paranoid Pirate):
//                 the link closes the socket, opens a new one and announces itself again,
//                 backing off from one heartbeat interval to 32 s while the broker stays away.
//   -> BYE        after a drain: on RequestDrain the link stops re-announcing, waits until every
//                 job it received has been reported, sends the held DONEs and BYE, and returns.
//
// While draining, DONE ids are held back and sent together at the end, so that the broker
// gets no credit back and sends no new work; the drain therefore ends after at most
// `capacity` jobs. Chunks already on their way are still run and reported.
//
// DONEs whose jobs were all "notified" (their producers got the result notice straight from
// Redis, so the broker sends them no FINISHED) are not urgent: the link holds them for up to
// Options::done_hold_us and sends them as one, as long as at most capacity / 4 ids are held (a
// DONE that is not all notified, or one that would pass that bound, sends the held ones first).
// At light load that keeps the broker's DONE work (and the worker's send) off the next job's
// path. The ResultWriter keeps such DONEs itself when asked to
// (ResultWriter::Options::hold_notified_ids) instead of handing each over: the link collects
// them once the oldest is due, on whatever wakes it, and sleeps no longer than that while any
// are kept (or, while it keeps collecting some, no longer than one hold with jobs outstanding);
// only the first id kept while it sleeps with no such deadline wakes it. A DONE of
// notified jobs thus waits one hold and up to the next whole millisecond (poll's unit), so the
// broker's view of this worker's credit lags by about two holds at most.
//
// Thread-safety: Start/Join from the owner; RequestDrain and the accessors from any thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "job_queue.h"
#include "result_writer.h"

namespace ferry::worker {

class BrokerLink {
 public:
  struct Options {
    std::string endpoint;        // the broker's backend, tcp://HOST:5556
    protocol::WorkerHello hello;  // what READY says
    // When set, READY says what this returns instead (called on the link's thread): the
    // worker's current resident models. A READY handed in through the outbox is a request to
    // re-announce now (dropped while draining).
    std::function<protocol::WorkerHello()> hello_fn;
    int64_t heartbeat_ms = 1000;
    int64_t liveness = 3;        // heartbeats the broker may miss before we reconnect
    std::string outbox_address;  // inproc address to bind the PULL socket on
    int64_t done_hold_us = 1000;  // how long DONEs of notified jobs may wait; 0 = not at all
  };

  // Everything passed in must outlive the link.
  BrokerLink(zmq::context_t* context, Options options, JobQueue* queue, ResultWriter* writer);
  ~BrokerLink();  // joins (a link that was started must be drained first)
  BrokerLink(const BrokerLink&) = delete;
  BrokerLink& operator=(const BrokerLink&) = delete;

  // Binds the outbox, connects to the broker, queues READY and starts the thread. Fails with
  // kInvalidArgument when an endpoint is malformed.
  Status Start();
  // Asks the thread to drain, send BYE and end. Idempotent.
  void RequestDrain() { drain_requested_.store(true); }
  // Waits until the thread has sent BYE.
  void Join();

  // Wall-clock microseconds of the last message from the broker (0: none yet).
  int64_t last_broker_message_us() const { return last_broker_us_.load(); }
  // Jobs received and not yet reported in a DONE.
  int64_t outstanding() const { return outstanding_.load(); }

  // How many DONE ids of notified jobs may wait, for a worker of this capacity (the link's own
  // bound, and the one to give ResultWriter::Options::hold_notified_ids).
  static size_t HeldIdsBound(int64_t capacity) {
    return static_cast<size_t>(std::max<int64_t>(capacity / 4, 0));
  }

 private:
  void Loop();
  void HandleBroker(protocol::Message* m);
  void HandleChunk(zmq::message_t body);
  void HandleCancel(const zmq::message_t& body);
  void HandleOutbox(protocol::Message* m);
  void SendReady();
  // Replaces the DEALER with a fresh one and re-announces (after a silent broker).
  void Reconnect();
  void MaybeReconnect(int64_t now_us);
  void Send(std::string_view command, zmq::message_t body);
  // True when a send would not block (the broker is connected or the queue has room).
  bool Writable();

  zmq::context_t* context_;
  const Options options_;
  JobQueue* queue_;
  ResultWriter* writer_;
  std::unique_ptr<zmq::socket_t> dealer_;
  std::unique_ptr<zmq::socket_t> outbox_;

  std::atomic<bool> drain_requested_{false};
  std::atomic<int64_t> last_broker_us_{0};
  std::atomic<int64_t> outstanding_{0};
  bool draining_ = false;               // loop thread only
  bool broker_silent_ = false;          // loop thread only; for one log line per silence
  // Held DONEs (loop thread only): while draining, or notified ones until hold_until_us_.
  std::vector<std::string> held_done_;
  int64_t held_duplicates_ = 0;           // their duplicates count
  protocol::DoneStatuses held_not_done_;  // their non-"done" statuses
  std::vector<std::string> held_notified_;  // those notified
  int64_t hold_until_us_ = 0;  // monotonic; when notified DONEs held outside a drain go out
  int64_t last_collected_us_ = 0;  // monotonic; when kept DONE ids were last taken (0: never)
  void HoldDone(const std::vector<std::string>& ids, int64_t duplicates,
                const protocol::DoneStatuses& not_done, const std::vector<std::string>& notified);
  void SendHeldDone();
  // Takes the DONE ids the writer kept once the oldest is due, or at once with `all` (in a
  // drain, which ends only when every job is accounted for), and sends them -- or, while
  // draining, holds them until BYE.
  void CollectWriterHeld(int64_t now_us, bool all);
  int64_t reconnect_interval_us_ = 0;  // loop thread only; current backoff
  int64_t next_reconnect_us_ = 0;      // loop thread only; wall clock
  int64_t reconnects_ = 0;
  int64_t chunks_ = 0;
  int64_t jobs_ = 0;
  std::thread thread_;
};

}  // namespace ferry::worker
