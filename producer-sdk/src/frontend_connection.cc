#include "frontend_connection.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {

FrontendConnection::FrontendConnection(std::string endpoint) : endpoint_(std::move(endpoint)) {}

Status FrontendConnection::Create(const std::string& endpoint,
                                  std::unique_ptr<FrontendConnection>* out) {
  std::unique_ptr<FrontendConnection> c;
  try {
    c.reset(new FrontendConnection(endpoint));
    c->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
    c->socket_ = zmq::socket_t(c->context_, zmq::socket_type::dealer);
    c->socket_.set(zmq::sockopt::linger, 0);
    c->socket_.set(zmq::sockopt::immediate, 1);
    // Safety net only: the driver sends after poll reports POLLOUT, so sends do not block.
    c->socket_.set(zmq::sockopt::sndtimeo, 100);
    try {
      c->socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("frontend endpoint \"" + endpoint + "\": " + e.what());
    }
  } catch (const std::exception& e) {  // zmq::error_t
    return Status::Internal(std::string("starting the frontend connection: ") + e.what());
  }
  *out = std::move(c);
  return Status::Ok();
}

Status FrontendConnection::Start(FinishedFn on_finished) {
  on_finished_ = std::move(on_finished);
  try {
    background_ = std::thread([this] { BackgroundLoop(); });
  } catch (const std::system_error& e) {
    return Status::Internal(std::string("starting the frontend connection: ") + e.what());
  }
  return Status::Ok();
}

FrontendConnection::~FrontendConnection() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // Pending calls get unavailable (an empty reply).
    for (auto& [rid, p] : pending_) SignalLocked(p.waiter);
    pending_.clear();
    posted_.clear();
    outbox_.clear();
    while (parked_head_) {
      Waiter* w = parked_head_;
      Unpark(w);
      w->cv.notify_one();
    }
  }
  background_cv_.notify_all();
  WakeDriver();
  if (background_.joinable()) background_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
  // socket_ closes (linger 0) before context_ terminates: members are destroyed in reverse.
}

void FrontendConnection::WakeDriver() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the driver wakes anyway
}

// ---- parking ---------------------------------------------------------------------------------

void FrontendConnection::Park(Waiter* w) {
  w->parked = true;
  w->next_parked = nullptr;
  w->prev_parked = parked_tail_;
  (parked_tail_ ? parked_tail_->next_parked : parked_head_) = w;
  parked_tail_ = w;
}

void FrontendConnection::Unpark(Waiter* w) {
  (w->prev_parked ? w->prev_parked->next_parked : parked_head_) = w->next_parked;
  (w->next_parked ? w->next_parked->prev_parked : parked_tail_) = w->prev_parked;
  w->prev_parked = w->next_parked = nullptr;
  w->parked = false;
}

void FrontendConnection::ReleaseDriver() {
  driver_ = Driver::kNone;
  driver_waiter_ = nullptr;
  offered_to_ = parked_head_;
  if (Waiter* next = parked_head_) {
    Unpark(next);
    next->cv.notify_one();  // it finds the socket free and drives
  } else if (background_asleep_) {
    background_cv_.notify_one();  // callers left it: the background thread's idle time starts
  }
}

void FrontendConnection::SignalLocked(Waiter* w) {
  w->signaled.store(true, std::memory_order_release);
  if (w->parked) {
    Unpark(w);
    w->cv.notify_one();
  } else if (driver_ == Driver::kCaller && driver_waiter_ == w &&
             driver_thread_ != std::this_thread::get_id()) {
    WakeDriver();  // it sleeps in poll: let it see the signal
  }
}

void FrontendConnection::Signal(Waiter* w) {
  std::lock_guard<std::mutex> lock(mu_);
  SignalLocked(w);
}

bool FrontendConnection::Await(Waiter* w, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return AwaitLocked(w, deadline, /*wake_driver=*/false, lock);
}

bool FrontendConnection::AwaitLocked(Waiter* w, Clock::time_point deadline, bool wake_driver,
                                     std::unique_lock<std::mutex>& lock) {
  // Leaving while the socket is free and others sleep (this waiter was handed the socket but was
  // signaled or timed out first): hand it on, or they would wait for the background thread.
  auto leave = [this, w](bool result) {
    if (offered_to_ == w) {
      offered_to_ = nullptr;
      if (driver_ == Driver::kNone) ReleaseDriver();  // to the next sleeper, or the background
    }
    return result;
  };
  while (!w->signaled.load(std::memory_order_acquire)) {
    if (stop_) return leave(false);
    if (Clock::now() >= deadline) return leave(false);
    if (driver_ == Driver::kNone) {
      offered_to_ = nullptr;
      driver_ = Driver::kCaller;
      driver_thread_ = std::this_thread::get_id();
      driver_waiter_ = w;
      lock.unlock();
      try {
        Drive([w] { return w->signaled.load(std::memory_order_acquire); }, deadline);
      } catch (...) {  // e.g. from the FINISHED callback: leave the socket to others, then throw
        lock.lock();
        caller_released_ = Clock::now();
        ReleaseDriver();
        throw;
      }
      lock.lock();
      caller_released_ = Clock::now();
      ReleaseDriver();
      continue;
    }
    if (driver_ == Driver::kBackground) {
      // Take the socket over: the background thread yields and hands it to the oldest parked
      // caller; from then on callers keep it while they keep blocking.
      background_yield_ = true;
      WakeDriver();
    } else if (wake_driver) {
      WakeDriver();  // another caller drives: it sends our request
      wake_driver = false;
    }
    Park(w);
    w->cv.wait_until(lock, deadline);
    if (w->parked) Unpark(w);  // timed out (Signal and ReleaseDriver unpark)
  }
  return leave(true);
}

// ---- calls -----------------------------------------------------------------------------------

Status FrontendConnection::Call(int64_t rid, std::string_view command, zmq::message_t body,
                                int timeout_ms, Reply* reply) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  Waiter w;
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return Status::Unavailable("client is shutting down");
  *reply = Reply();
  pending_[rid] = Pending{&w, reply};
  outbox_.push_back(Outgoing{rid, std::string(command), std::move(body)});
  if (!AwaitLocked(&w, deadline, /*wake_driver=*/true, lock)) {
    // The reply is delivered under mu_: if it is still pending, it did not come.
    if (pending_.erase(rid) == 1) {
      DropQueued(rid);
      if (stop_) return Status::Unavailable("client is shutting down");
      return Status::Unavailable("broker at " + endpoint_ + " did not answer " +
                                 std::string(command) + " within " + std::to_string(timeout_ms) +
                                 " ms (is ferry-broker running and reachable?)");
    }
  }
  if (reply->command.empty()) return Status::Unavailable("client is shutting down");
  return Status::Ok();
}

void FrontendConnection::Post(int64_t rid, std::string_view command, zmq::message_t body,
                              ReplyFn on_reply) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  posted_[rid] = std::move(on_reply);
  outbox_.push_back(Outgoing{rid, std::string(command), std::move(body)});
  // A driver asleep in poll sends it now; with none, the poster's own Await (or, after
  // kIdleHandback, the background thread) drives and sends it first thing.
  if (driver_ != Driver::kNone) WakeDriver();
}

bool FrontendConnection::Unpost(int64_t rid) {
  std::lock_guard<std::mutex> lock(mu_);
  posted_.erase(rid);
  return DropQueued(rid);
}

bool FrontendConnection::DropQueued(int64_t rid) {
  auto it = std::find_if(outbox_.begin(), outbox_.end(),
                         [rid](const Outgoing& o) { return o.rid == rid; });
  if (it == outbox_.end()) return false;
  outbox_.erase(it);
  return true;
}

// ---- driving the socket ----------------------------------------------------------------------

void FrontendConnection::SetPush(std::unique_ptr<protocol::RedisSubscriber> push,
                                 std::function<void()> on_lost) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    push_next_ = std::move(push);
    push_lost_next_ = std::move(on_lost);
    push_active_.store(push_next_ != nullptr, std::memory_order_release);
  }
  WakeDriver();  // a driver asleep in poll starts polling the new subscription
}

void FrontendConnection::ReadPush() {
  const Status s = push_->ReadAvailable([this](std::string_view payload) {
    msgpack::object_handle oh;
    if (protocol::UnpackMap(payload.data(), payload.size(), &oh).ok()) DispatchFinished(oh.get());
  });
  if (s.ok()) return;
  push_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!push_next_) push_active_.store(false, std::memory_order_release);
  }
  if (push_lost_) push_lost_();
}

template <typename Until>
void FrontendConnection::Drive(Until until, Clock::time_point deadline) {
  const bool forever = deadline == Clock::time_point::max();
  while (!stop_) {
    SendQueued();
    if (until()) return;
    bool want_out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      want_out = !outbox_.empty();
      if (push_next_) {
        push_ = std::move(push_next_);
        push_lost_ = std::move(push_lost_next_);
      }
    }
    long timeout_ms = -1;
    if (!forever) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return;
      // Round up: poll's unit is the millisecond.
      timeout_ms = static_cast<long>(
          std::chrono::ceil<std::chrono::milliseconds>(left).count());
    }
    zmq_pollitem_t items[3] = {
        {socket_.handle(), 0, static_cast<short>(ZMQ_POLLIN | (want_out ? ZMQ_POLLOUT : 0)), 0},
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
        {nullptr, push_ ? push_->fd() : -1, ZMQ_POLLIN, 0},
    };
    if (protocol::PollSockets(items, push_ ? 3 : 2, timeout_ms) < 0) {
      if (zmq_errno() == ETERM) return;
      continue;  // EINTR
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t count;
      ssize_t n = read(wake_fd_, &count, sizeof(count));
      (void)n;
    }
    if (push_ && (items[2].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) ReadPush();
    if (items[0].revents & ZMQ_POLLIN) ReceiveAll();
    if (until()) {
      SendQueued();  // what other callers queued meanwhile goes out before the socket is left
      return;
    }
  }
}

void FrontendConnection::BackgroundLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    ++background_turns_;
    // Callers drive while they block; the socket is taken only after they left it idle, and
    // never while a caller sleeps or has just been handed it.
    const Clock::time_point now = Clock::now();
    const bool callers_have_it =
        driver_ != Driver::kNone || offered_to_ != nullptr || parked_head_ != nullptr;
    if (callers_have_it) {
      if (now - caller_released_ < kIdleHandback) {
        // Callers come and go faster than kIdleHandback (light load): look again then, rather
        // than be woken at every job.
        background_cv_.wait_until(lock, now + kIdleHandback);
      } else {
        // One caller keeps it (a long wait): sleep until ReleaseDriver finds nobody to hand
        // it to. A sleeper is parked only while someone drives or has been offered the
        // socket, so that is the only way callers leave it.
        background_asleep_ = true;
        background_cv_.wait(lock);
        background_asleep_ = false;
      }
      continue;
    }
    const Clock::time_point idle_until = caller_released_ + kIdleHandback;
    if (now < idle_until) {
      background_cv_.wait_until(lock, idle_until);
      continue;
    }
    driver_ = Driver::kBackground;
    offered_to_ = nullptr;
    driver_thread_ = std::this_thread::get_id();
    background_yield_ = false;
    lock.unlock();
    try {
      Drive([this] { return background_yield_.load(); }, Clock::time_point::max());
    } catch (...) {
      // Out of a callback (FINISHED or a push notice, e.g. std::bad_alloc): no caller to hand
      // it to, and letting it leave the thread would end the process. What that read was
      // handling is dropped -- the notice, and any further ones already buffered from the same
      // read of the push subscription until the next one arrives -- and the waiters for those
      // jobs find their results by their re-check of the result store. (Client::Run's reply
      // handler catches its own exceptions: a lost rejection would leave its caller waiting.)
      ++background_errors_;
    }
    lock.lock();
    // Yielded to a caller: callers are active, so stay away for kIdleHandback (taking the
    // socket back at once would make the two take it from each other in a loop).
    if (background_yield_) {
      caller_released_ = Clock::now();
      ++background_yields_;
    }
    ReleaseDriver();
  }
}

void FrontendConnection::SendQueued() {
  while (!stop_) {
    Outgoing next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (outbox_.empty()) return;
    }
    // Only while the socket takes a message without blocking (no broker connected, or the
    // high-water mark reached: the next poll waits for POLLOUT).
    try {
      if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLOUT)) return;
    } catch (const zmq::error_t&) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (outbox_.empty()) return;
      next = std::move(outbox_.front());
      outbox_.pop_front();
    }
    // A failed send leaves the caller to time out: the broker is unreachable either way.
    (void)protocol::SendMessage(socket_, nullptr, next.command, std::move(next.body));
  }
}

void FrontendConnection::ReceiveAll() {
  while (!stop_) {
    protocol::Message m;
    Status s = protocol::RecvMessage(socket_, /*router=*/false, &m, /*dont_wait=*/true);
    if (s.code() == codes::kUnavailable) return;  // drained
    if (!s.ok()) continue;                        // not Ferry framing: drop it
    Dispatch(std::move(m.command), std::move(m.body));
  }
}

void FrontendConnection::DispatchFinished(const msgpack::object& body) {
  std::vector<std::string> ids;
  protocol::InlineResults records;  // a malformed "results" map: just the ids
  if (!protocol::DecodeInlineResults(body, &records).ok()) records.clear();
  if (protocol::GetStringArray(body, "ids", &ids).ok() && on_finished_) on_finished_(ids, records);
}

void FrontendConnection::Dispatch(std::string command, zmq::message_t body) {
  int64_t rid = 0;
  {
    msgpack::object_handle oh;
    if (!protocol::UnpackMap(body.data(), body.size(), &oh).ok()) return;
    if (command == protocol::kFinished) {
      DispatchFinished(oh.get());
      return;
    }
    // Replies without a rid (an ERROR for a message the broker could not decode) cannot be
    // matched; their caller times out.
    if (!protocol::GetInt(oh.get(), "rid", &rid, 0).ok() || rid == 0) return;
  }
  ReplyFn posted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(rid);
    if (it != pending_.end()) {
      *it->second.reply = Reply{std::move(command), std::move(body)};
      Waiter* w = it->second.waiter;
      pending_.erase(it);
      SignalLocked(w);
      return;
    }
    auto p = posted_.find(rid);
    if (p == posted_.end()) return;  // its caller gave up, or nobody waits for this reply
    posted = std::move(p->second);
    posted_.erase(p);
  }
  posted(Reply{std::move(command), std::move(body)});  // outside mu_: it may Signal waiters
}

}  // namespace ferry::client
