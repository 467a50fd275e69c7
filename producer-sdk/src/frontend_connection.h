#pragma once
// FrontendConnection: the producer's one DEALER socket to the broker's frontend ROUTER, owned by
// one background I/O thread (ZeroMQ sockets must not be shared between threads).
//
// Callers hand requests to the I/O thread through a mutex-guarded outbox and an eventfd that
// wakes its zmq::poll; each request carries a request id ("rid") that the broker echoes, and the
// caller waits on a future matched by that rid. Unsolicited FINISHED notices go to a callback.
// The I/O thread never touches Redis and never blocks on anything but zmq::poll.
//
// The socket is ZMQ_IMMEDIATE: while no broker is connected nothing is queued, so a request
// that timed out is never delivered to a broker that comes up later (it is dropped from the
// outbox when its caller gives up). Linger is 0: destruction never waits for the network.
//
// Thread-safety: NextRid and Call may be called from any number of threads at once.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/messages.h"
#include "ferry/status.h"

namespace ferry::client {

class FrontendConnection {
 public:
  struct Reply {
    std::string command;   // e.g. ACCEPTED, STATS, ERROR
    zmq::message_t body;   // msgpack map bytes (unpack with protocol::UnpackMap)
  };
  // Called on the I/O thread with the ids of each FINISHED message and its inline results
  // (views valid during the call only). Must not block.
  using FinishedFn = std::function<void(const std::vector<std::string>& ids,
                                        const protocol::InlineResults& records)>;

  // Connects (asynchronously: no broker needs to be up) and starts the I/O thread.
  // invalid_argument when ZeroMQ rejects the endpoint.
  static Status Create(const std::string& endpoint, FinishedFn on_finished,
                       std::unique_ptr<FrontendConnection>* out);
  ~FrontendConnection();  // stops and joins the I/O thread; pending calls get unavailable

  // A fresh request id (never 0) to put in the body as "rid".
  int64_t NextRid() { return next_rid_.fetch_add(1) + 1; }

  // Sends [FERRY1, command, body] and waits for the reply whose "rid" equals `rid`.
  // unavailable when no reply came within timeout_ms (the broker is down or overloaded).
  Status Call(int64_t rid, std::string_view command, zmq::message_t body, int timeout_ms,
              Reply* reply);

 private:
  struct Outgoing {
    int64_t rid;
    std::string command;
    zmq::message_t body;
  };
  struct Pending {
    std::promise<Reply> promise;
  };

  FrontendConnection(std::string endpoint, FinishedFn on_finished);
  void Wake();
  void Run();           // the I/O thread's loop
  void ReceiveAll();    // drains the socket
  void SendQueued();    // sends while the socket takes messages
  void Dispatch(std::string command, zmq::message_t body);
  void FailAllPending();

  const std::string endpoint_;
  const FinishedFn on_finished_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;  // I/O thread only (after Create)
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_rid_{0};
  std::thread thread_;

  std::mutex mu_;
  std::deque<Outgoing> outbox_;                                     // guarded by mu_
  std::unordered_map<int64_t, std::shared_ptr<Pending>> pending_;  // by rid; guarded by mu_
};

}  // namespace ferry::client
