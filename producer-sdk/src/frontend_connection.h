#pragma once
// FrontendConnection: the producer's one DEALER socket to the broker's frontend ROUTER.
//
// A ZeroMQ socket must be used by one thread at a time, so the socket has a *driver*: the one
// thread that may send on it, poll it and receive from it. Leader/follower: a caller that
// blocks (Call waiting for its reply, or ResultTracker::Wait through Await) becomes the driver
// when nobody else is; it sends what is queued, receives, and dispatches every reply and
// FINISHED notice -- its own and other callers' -- until its own arrives, then passes the role
// to another blocked caller (if any). Other callers queue their requests in an outbox, wake the
// driver through an eventfd, and sleep until signaled. At light load a request, its reply and
// its FINISHED notice therefore never wake another thread of this process.
//
// A background thread drives the socket while no caller has for kIdleHandback, so replies and
// notices that nobody is waiting for yet are still read (nothing is lost before that either:
// ZeroMQ queues them). A caller that needs the socket while that thread drives asks it to yield.
// While callers come and go, that thread looks every kIdleHandback; while one caller keeps the
// socket longer (a long wait), it sleeps until the socket is left with nobody to hand it to.
//
// Each request carries a request id ("rid") that the broker echoes; replies are matched by it.
// Unsolicited FINISHED notices go to a callback, on whichever thread drives. An exception out of
// a callback reaches the caller that drives (which leaves the socket to others first); on the
// background thread it is caught and counted (background_errors()), and the thread goes on.
//
// The socket is ZMQ_IMMEDIATE: while no broker is connected nothing is queued, so a request
// that timed out is never delivered to a broker that comes up later (it is dropped from the
// outbox when its caller gives up). Linger is 0: destruction never waits for the network.
//
// Result notices from workers (optional): a RedisSubscriber handed over with SetPush is polled by
// the driver beside the socket, and each notice on it (a FINISHED body) goes to the same
// callback as FINISHED. If the subscription fails it is dropped (push_active() turns false) and
// its `on_lost` callback runs (the broker sends no FINISHED for jobs whose notice went there).
//
// Thread-safety: NextRid, Call, Post, Unpost, Await, Signal, SetPush and push_active may be
// called from any number of threads.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/redis.h"
#include "ferry/status.h"
#include "waiter.h"

namespace ferry::client {

class FrontendConnection : public Parking {
 public:
  // How long the socket may go undriven by callers before the background thread takes it.
  static constexpr std::chrono::milliseconds kIdleHandback{5};

  struct Reply {
    std::string command;   // e.g. ACCEPTED, STATS, ERROR
    zmq::message_t body;   // msgpack map bytes (unpack with protocol::UnpackMap)
  };
  // Called on the driving thread with the ids of each FINISHED message and its inline results
  // (views valid during the call only). Must not block, and must not call Await.
  using FinishedFn = std::function<void(const std::vector<std::string>& ids,
                                        const protocol::InlineResults& records)>;

  // Connects (asynchronously: no broker needs to be up). invalid_argument when ZeroMQ rejects
  // the endpoint. Nothing is read until Start.
  static Status Create(const std::string& endpoint, std::unique_ptr<FrontendConnection>* out);
  ~FrontendConnection() override;  // stops the background thread; pending calls get unavailable

  // Starts the background thread; `on_finished` receives FINISHED notices from now on.
  Status Start(FinishedFn on_finished);

  // A fresh request id (never 0) to put in the body as "rid".
  int64_t NextRid() { return next_rid_.fetch_add(1) + 1; }

  // Sends [FERRY1, command, body] and waits for the reply whose "rid" equals `rid`.
  // unavailable when no reply came within timeout_ms (the broker is down or overloaded).
  Status Call(int64_t rid, std::string_view command, zmq::message_t body, int timeout_ms,
              Reply* reply);

  // Called on the driving thread with the reply to a Post()ed request. Must not block, and must
  // not call Await.
  using ReplyFn = std::function<void(Reply reply)>;
  // Sends [FERRY1, command, body] without waiting: a request the broker may leave unanswered
  // (SUBMIT with "ack": false). If a reply whose "rid" equals `rid` comes before Unpost(rid),
  // `on_reply` gets it (once).
  void Post(int64_t rid, std::string_view command, zmq::message_t body, ReplyFn on_reply);
  // Forgets `rid`'s reply handler. Returns true when the request had not been sent yet (no
  // broker connected): it is dropped and never will be.
  bool Unpost(int64_t rid);

  // Hands over a subscribed Redis connection for result notices; the driver polls it from its
  // next turn on. Replaces any earlier one. `on_lost` is called (on the driving thread, like
  // the FINISHED callback) if the subscription fails: notices published since may be lost.
  void SetPush(std::unique_ptr<protocol::RedisSubscriber> push, std::function<void()> on_lost);
  // Whether a push subscription is in place and has not failed.
  bool push_active() const { return push_active_.load(std::memory_order_acquire); }

  // How many times the background thread has handed the socket to a caller, and how many turns
  // its loop has made: one per wake-up and one per return from driving (for tests).
  int64_t background_yields() const { return background_yields_.load(); }
  int64_t background_turns() const { return background_turns_.load(); }
  // Exceptions the background thread caught while driving (e.g. std::bad_alloc out of the
  // FINISHED callback): each one dropped the notice it was handling and the thread went on.
  int64_t background_errors() const { return background_errors_.load(); }

  // Parking: a blocked caller drives the socket while nobody else does.
  bool Await(Waiter* w, Clock::time_point deadline) override;
  void Signal(Waiter* w) override;

 private:
  enum class Driver { kNone, kBackground, kCaller };
  struct Outgoing {
    int64_t rid;
    std::string command;
    zmq::message_t body;
  };
  struct Pending {
    Waiter* waiter;
    Reply* reply;  // filled under mu_ before the waiter is signaled; left empty at shutdown
  };

  explicit FrontendConnection(std::string endpoint);
  void WakeDriver();
  void BackgroundLoop();
  // Runs the socket on this thread (the driver) until `until()` says stop or `deadline`.
  template <typename Until>
  void Drive(Until until, Clock::time_point deadline);
  // The rest run with mu_ held.
  bool AwaitLocked(Waiter* w, Clock::time_point deadline, bool wake_driver,
                   std::unique_lock<std::mutex>& lock);
  void SignalLocked(Waiter* w);
  void Park(Waiter* w);
  void Unpark(Waiter* w);
  void ReleaseDriver();  // the socket is free: lets the longest-parked caller take it
  bool DropQueued(int64_t rid);  // removes rid's request if still unsent; whether it was
  void ReceiveAll();  // drains the socket
  void SendQueued();  // sends while the socket takes messages
  void Dispatch(std::string command, zmq::message_t body);
  // A FINISHED body (from the broker, or a worker's notice): hands its ids and records over.
  void DispatchFinished(const msgpack::object& body);
  void ReadPush();  // the driver: drains the push subscription, drops it when it failed

  const std::string endpoint_;
  FinishedFn on_finished_;  // set by Start, before the first drive
  zmq::context_t context_{1};
  zmq::socket_t socket_;  // the driver only
  std::unique_ptr<protocol::RedisSubscriber> push_;  // the driver only
  std::function<void()> push_lost_;                   // the driver only
  std::unique_ptr<protocol::RedisSubscriber> push_next_;  // guarded by mu_: for the driver to take
  std::function<void()> push_lost_next_;                  // guarded by mu_
  std::atomic<bool> push_active_{false};
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_rid_{0};
  std::thread background_;

  std::mutex mu_;
  Driver driver_ = Driver::kNone;                        // guarded by mu_
  std::thread::id driver_thread_;                        // guarded by mu_
  Waiter* driver_waiter_ = nullptr;                      // guarded by mu_: a driving caller's
  Waiter* offered_to_ = nullptr;                         // guarded by mu_: woken to drive next
  std::atomic<bool> background_yield_{false};            // a caller wants the socket
  std::atomic<int64_t> background_yields_{0};
  std::atomic<int64_t> background_turns_{0};
  std::atomic<int64_t> background_errors_{0};
  Clock::time_point caller_released_;                    // guarded by mu_
  bool background_asleep_ = false;  // guarded by mu_: waits for ReleaseDriver, not a timeout
  std::condition_variable background_cv_;                // the background thread parks here
  Waiter* parked_head_ = nullptr;                        // guarded by mu_: callers asleep,
  Waiter* parked_tail_ = nullptr;                        //   oldest first
  std::deque<Outgoing> outbox_;                          // guarded by mu_
  std::unordered_map<int64_t, Pending> pending_;         // by rid; guarded by mu_
  std::unordered_map<int64_t, ReplyFn> posted_;          // by rid; guarded by mu_
};

}  // namespace ferry::client
