#include "frontend_connection.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {

FrontendConnection::FrontendConnection(std::string endpoint, FinishedFn on_finished)
    : endpoint_(std::move(endpoint)), on_finished_(std::move(on_finished)) {}

Status FrontendConnection::Create(const std::string& endpoint, FinishedFn on_finished,
                                  std::unique_ptr<FrontendConnection>* out) {
  std::unique_ptr<FrontendConnection> c;
  try {
    c.reset(new FrontendConnection(endpoint, std::move(on_finished)));
    c->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
    c->socket_ = zmq::socket_t(c->context_, zmq::socket_type::dealer);
    c->socket_.set(zmq::sockopt::linger, 0);
    c->socket_.set(zmq::sockopt::immediate, 1);
    // Safety net only: the I/O thread sends after poll reports POLLOUT, so sends do not block.
    c->socket_.set(zmq::sockopt::sndtimeo, 100);
    try {
      c->socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("frontend endpoint \"" + endpoint + "\": " + e.what());
    }
    c->thread_ = std::thread([p = c.get()] { p->Run(); });
  } catch (const std::exception& e) {  // zmq::error_t, std::system_error
    return Status::Internal(std::string("starting the frontend connection: ") + e.what());
  }
  *out = std::move(c);
  return Status::Ok();
}

FrontendConnection::~FrontendConnection() {
  stop_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  FailAllPending();
  if (wake_fd_ >= 0) close(wake_fd_);
  // socket_ closes (linger 0) before context_ terminates: members are destroyed in reverse.
}

void FrontendConnection::Wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the thread wakes anyway
}

Status FrontendConnection::Call(int64_t rid, std::string_view command, zmq::message_t body,
                                int timeout_ms, Reply* reply) {
  auto pending = std::make_shared<Pending>();
  std::future<Reply> future = pending->promise.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Status::Unavailable("client is shutting down");
    pending_[rid] = pending;
    outbox_.push_back(Outgoing{rid, std::string(command), std::move(body)});
  }
  Wake();
  if (future.wait_for(std::chrono::milliseconds(std::max(timeout_ms, 0))) !=
      std::future_status::ready) {
    bool taken_by_io_thread;
    {
      std::lock_guard<std::mutex> lock(mu_);
      taken_by_io_thread = pending_.erase(rid) == 0;
      auto it = std::find_if(outbox_.begin(), outbox_.end(),
                             [rid](const Outgoing& o) { return o.rid == rid; });
      if (it != outbox_.end()) outbox_.erase(it);
    }
    // The reply raced the timeout and is being handed over right now: take it.
    if (!taken_by_io_thread) {
      return Status::Unavailable("broker at " + endpoint_ + " did not answer " +
                                 std::string(command) + " within " + std::to_string(timeout_ms) +
                                 " ms (is ferry-broker running and reachable?)");
    }
  }
  *reply = future.get();
  if (reply->command.empty()) return Status::Unavailable("client is shutting down");
  return Status::Ok();
}

void FrontendConnection::Run() {
  while (!stop_) {
    bool want_out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      want_out = !outbox_.empty();
    }
    zmq_pollitem_t items[2] = {
        {socket_.handle(), 0, static_cast<short>(ZMQ_POLLIN | (want_out ? ZMQ_POLLOUT : 0)), 0},
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
    };
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      continue;  // EINTR
    }
    bool woken = false;
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t count;
      ssize_t n = read(wake_fd_, &count, sizeof(count));
      (void)n;
      woken = true;
    }
    if (items[0].revents & ZMQ_POLLIN) ReceiveAll();
    // A caller woke us with a request: send it now if the socket takes it (no second poll).
    if ((items[0].revents & ZMQ_POLLOUT) || woken) SendQueued();
  }
  try {
    socket_.close();
  } catch (const zmq::error_t&) {
  }
}

void FrontendConnection::SendQueued() {
  while (!stop_) {
    // Only while the socket takes a message without blocking (no broker connected, or the
    // high-water mark reached: the next poll waits for POLLOUT).
    try {
      if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLOUT)) return;
    } catch (const zmq::error_t&) {
      return;
    }
    Outgoing next;
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

void FrontendConnection::Dispatch(std::string command, zmq::message_t body) {
  int64_t rid = 0;
  {
    msgpack::object_handle oh;
    if (!protocol::UnpackMap(body.data(), body.size(), &oh).ok()) return;
    if (command == protocol::kFinished) {
      std::vector<std::string> ids;
      protocol::InlineResults records;  // a malformed "results" map: just the ids
      if (!protocol::DecodeInlineResults(oh.get(), &records).ok()) records.clear();
      if (protocol::GetStringArray(oh.get(), "ids", &ids).ok() && on_finished_)
        on_finished_(ids, records);
      return;
    }
    // Replies without a rid (an ERROR for a message the broker could not decode) cannot be
    // matched; their caller times out.
    if (!protocol::GetInt(oh.get(), "rid", &rid, 0).ok() || rid == 0) return;
  }
  std::shared_ptr<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(rid);
    if (it == pending_.end()) return;  // its caller gave up
    pending = std::move(it->second);
    pending_.erase(it);
  }
  pending->promise.set_value(Reply{std::move(command), std::move(body)});
}

void FrontendConnection::FailAllPending() {
  std::unordered_map<int64_t, std::shared_ptr<Pending>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
    outbox_.clear();
  }
  for (auto& [rid, p] : pending) p->promise.set_value(Reply{});
}

}  // namespace ferry::client
