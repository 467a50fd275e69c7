#include "io_thread.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {
namespace {

using std::chrono::milliseconds;

constexpr int kPushRetryMinMs = 1000, kPushRetryMaxMs = 30000;
// How often replies that callers forgot are dropped from the table (a Run's request stays there
// until its call ends, since the broker answers an "ack": false SUBMIT only when it rejects).
constexpr milliseconds kSweepEvery{100};
// How long a LIMITS waits for its answer before it goes out again while requests wait behind it
// (the sweep's wake-ups look). One sent as the connection drops is lost without a trace: libzmq
// tells the monitor of the drop before it takes the dead connection's pipe away, and a send in
// between goes into that pipe. Without a resend, everything behind it waited for the next drop.
constexpr milliseconds kLimitsResendEvery{500};
// Messages read per turn before the mailbox is looked at again.
constexpr int kMaxReceivesPerTurn = 1024;

// Milliseconds until `t` for poll: rounded up, never negative.
long MillisUntil(IoThread::Clock::time_point t, IoThread::Clock::time_point now) {
  if (t <= now) return 0;
  return static_cast<long>(std::chrono::ceil<milliseconds>(t - now).count());
}

}  // namespace

class IoThread::Request {
 public:
  enum Phase { kQueued, kSent, kForgotten };
  int64_t rid = 0;
  std::string command;
  zmq::message_t body;                 // moved out when sent
  std::vector<zmq::message_t> frames;  // attached inputs' data frames; moved out when sent
  ReplyFn on_reply;
  // kQueued -> kSent (the I/O thread, as it sends) or kQueued -> kForgotten (the caller, before
  // that): whoever moves it first decides whether the request ever goes out.
  std::atomic<int> phase{kQueued};
};

IoThread::IoThread(Options options) : options_(std::move(options)) {}

Status IoThread::Start(Options options, std::unique_ptr<IoThread>* out) {
  std::unique_ptr<IoThread> t(new IoThread(std::move(options)));
  t->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));
  try {
    t->socket_ = zmq::socket_t(t->context_, zmq::socket_type::dealer);
    t->socket_.set(zmq::sockopt::linger, 0);
    t->socket_.set(zmq::sockopt::immediate, 1);
    // Safety net only: the thread sends after ZMQ_EVENTS reports POLLOUT.
    t->socket_.set(zmq::sockopt::sndtimeo, 100);
    FERRY_RETURN_IF_ERROR(protocol::ApplyCurveClient(t->socket_, t->options_.curve_server_public,
                                                     t->options_.curve_secret));
    // Handshake events, so that a refused key or a wrong broker key is said, not just a timeout.
    t->handshake_watch_ = protocol::HandshakeWatch(!t->options_.curve_secret.empty());
    const std::string monitor = "inproc://ferry-sdk-monitor-" + protocol::NewUuid();
    if (zmq_socket_monitor(t->socket_.handle(), monitor.c_str(), protocol::kHandshakeWatchEvents) !=
        0)
      return Status::Internal(std::string("zmq_socket_monitor: ") + zmq_strerror(zmq_errno()));
    t->monitor_ = zmq::socket_t(t->context_, zmq::socket_type::pair);
    t->monitor_.set(zmq::sockopt::linger, 0);
    t->monitor_.connect(monitor);
    try {
      t->socket_.connect(t->options_.frontend);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("frontend endpoint \"" + t->options_.frontend +
                                     "\": " + e.what());
    }
    t->thread_ = std::thread([p = t.get()] { p->Loop(); });
  } catch (const std::exception& e) {  // zmq::error_t, std::system_error
    return Status::Internal(std::string("starting the I/O thread: ") + e.what());
  }
  *out = std::move(t);
  return Status::Ok();
}

IoThread::~IoThread() {
  {
    std::lock_guard<std::mutex> lock(mailbox_mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is already non-zero, so the thread wakes anyway.
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
  // socket_ closes (linger 0) before context_ terminates: members are destroyed in reverse.
}

// ---- what callers call -----------------------------------------------------------------------

std::shared_ptr<IoThread::Request> IoThread::Post(int64_t rid, std::string_view command,
                                                  zmq::message_t body, ReplyFn on_reply,
                                                  std::vector<zmq::message_t> frames) {
  auto request = std::make_shared<Request>();
  request->rid = rid;
  request->command = std::string(command);
  request->body = std::move(body);
  request->frames = std::move(frames);
  request->on_reply = std::move(on_reply);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mailbox_mu_);
    if (stop_) return request;  // never sent: its caller times out
    mailbox_.push_back(request);
    wake = asleep_;
    asleep_ = false;  // one wake-up for all the posts until the thread looks
  }
  if (wake) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // EAGAIN: already non-zero; the thread wakes anyway.
    }
  }
  return request;
}

bool IoThread::Forget(const std::shared_ptr<Request>& request) {
  int queued = Request::kQueued;
  if (request->phase.compare_exchange_strong(queued, Request::kForgotten)) return true;
  request->phase.store(Request::kForgotten);  // sent: a late reply is dropped
  return false;
}

namespace {
// A caller's wait for a reply the I/O thread delivers.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  IoThread::Reply reply;

  IoThread::ReplyFn Setter(std::shared_ptr<Completion> self) {
    return [self = std::move(self)](IoThread::Reply r) {
      {
        std::lock_guard<std::mutex> lock(self->mu);
        self->reply = std::move(r);
        self->done = true;
      }
      self->cv.notify_one();  // after the unlock: the woken caller does not block on mu again
    };
  }
  bool WaitUntil(IoThread::Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_until(lock, deadline, [&] { return done; });
  }
};
}  // namespace

Status IoThread::Call(int64_t rid, std::string_view command, zmq::message_t body, int timeout_ms,
                      Reply* reply, std::vector<zmq::message_t> frames, bool* unsent) {
  if (unsent) *unsent = false;
  auto completion = std::make_shared<Completion>();
  const Clock::time_point deadline = Clock::now() + milliseconds(std::max(timeout_ms, 0));
  auto request =
      Post(rid, command, std::move(body), completion->Setter(completion), std::move(frames));
  if (!completion->WaitUntil(deadline)) {
    const bool never_sent = Forget(request);
    if (unsent) *unsent = never_sent;
    const std::string why = handshake_error();
    return Status::Unavailable("broker at " + options_.frontend + " did not answer " +
                               std::string(command) + " within " + std::to_string(timeout_ms) +
                               " ms (" +
                               (why.empty() ? "is ferry-broker running and reachable?" : why) +
                               ")" + (never_sent ? "; it was not sent" : ""));
  }
  std::lock_guard<std::mutex> lock(completion->mu);
  *reply = std::move(completion->reply);
  return Status::Ok();
}

std::string IoThread::handshake_error() const {
  std::lock_guard<std::mutex> lock(handshake_mu_);
  return handshake_error_;
}

std::string IoThread::push_channel() const {
  std::lock_guard<std::mutex> lock(channel_mu_);
  return channel_;
}

bool IoThread::subscribe_due() const {
  return options_.push_results && !subscribed_.load() &&
         Clock::now().time_since_epoch().count() >= push_retry_at_ns_.load();
}

void IoThread::Subscribe(int timeout_ms) {
  // A request with no command: the thread subscribes instead of sending it, then replies.
  auto completion = std::make_shared<Completion>();
  auto request = Post(0, "", zmq::message_t(), completion->Setter(completion));
  if (!completion->WaitUntil(Clock::now() + milliseconds(std::max(timeout_ms, 0)))) Forget(request);
}

// ---- the I/O thread --------------------------------------------------------------------------

template <typename Fn>
void IoThread::RunCallback(Fn&& fn) {
  try {
    fn();
  } catch (...) {
    // What the callback was handling is dropped; a waiter for those jobs finds its result by
    // its own re-check of Redis (ResultTracker), a Call by its timeout.
    ++callback_errors_;
  }
}

void IoThread::Loop() {
  while (true) {
    ++loop_turns_;
    bool stopping = false;
    {
      std::vector<std::shared_ptr<Request>> taken;
      {
        std::lock_guard<std::mutex> lock(mailbox_mu_);
        taken.swap(mailbox_);
        stopping = stop_;
      }
      if (stopping) break;
      std::vector<std::shared_ptr<Request>> subscribes;
      for (auto& r : taken) {
        if (r->phase.load() == Request::kForgotten) continue;
        if (r->command.empty()) {
          subscribes.push_back(std::move(r));
          continue;
        }
        awaiting_[r->rid] = r;
        unsent_.push_back(std::move(r));
      }
      SendQueued();
      if (!subscribes.empty()) {
        MaybeSubscribe();
        for (auto& r : subscribes) RunCallback([&] { r->on_reply(Reply{}); });
      }
    }
    const Clock::time_point now = Clock::now();
    if (now >= next_sweep_) SweepPending(now);

    // Sleep until work comes: a post, a message, a notice -- or the next sweep while requests
    // are outstanding.
    long timeout_ms = -1;
    if (!awaiting_.empty() || !unsent_.empty()) timeout_ms = MillisUntil(next_sweep_, now);
    {
      std::lock_guard<std::mutex> lock(mailbox_mu_);
      if (!mailbox_.empty() || stop_) continue;
      asleep_ = true;
    }
    // POLLOUT while something could go out: LIMITS, on a connection that has not had it (or
    // whose LIMITS is due again), or queued requests once the limits are known.
    const bool want_out = limits_.max_message_bytes == 0 ? LimitsDue(now) : !unsent_.empty();
    const short socket_events = static_cast<short>(ZMQ_POLLIN | (want_out ? ZMQ_POLLOUT : 0));
    zmq_pollitem_t items[4] = {
        {socket_.handle(), 0, socket_events, 0},
        {monitor_.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
        {nullptr, push_ ? push_->fd() : -1, ZMQ_POLLIN, 0},
    };
    const int rc = protocol::PollSockets(items, push_ ? 4 : 3, timeout_ms);
    {
      std::lock_guard<std::mutex> lock(mailbox_mu_);
      asleep_ = false;
    }
    if (rc < 0) {
      if (zmq_errno() == ETERM) break;
      continue;  // EINTR
    }
    if (items[2].revents & ZMQ_POLLIN) {
      uint64_t count;
      if (read(wake_fd_, &count, sizeof(count)) < 0) {
        // EAGAIN: another read got it; nothing to do.
      }
    }
    if (items[1].revents & ZMQ_POLLIN) ReadMonitor();
    if (push_ && (items[3].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) ReadPush();
    if (items[0].revents & ZMQ_POLLIN) ReceiveAll();
  }
}

// Whether the socket takes a message without blocking: not when no broker is connected, or its
// high-water mark is reached (the next poll then waits for POLLOUT).
bool IoThread::Writable() {
  try {
    return (socket_.get(zmq::sockopt::events) & ZMQ_POLLOUT) != 0;
  } catch (const zmq::error_t&) {
    return false;
  }
}

void IoThread::SendQueued() {
  // A connection's first request is LIMITS; nothing else goes out before its answer.
  if (limits_.max_message_bytes == 0) {
    if (LimitsDue(Clock::now()) && Writable()) SendLimits();
    return;
  }
  bool writable = true;
  while (!unsent_.empty()) {
    Request& r = *unsent_.front();
    if (r.phase.load() == Request::kForgotten) {  // its caller gave up before it went out
      unsent_.pop_front();
      continue;
    }
    size_t bytes = r.body.size();
    for (const auto& f : r.frames) bytes += f.size();
    if (bytes > static_cast<size_t>(limits_.max_message_bytes)) {  // a SUBMIT, a CANCEL
      RefuseTooLarge(r, bytes);
      unsent_.pop_front();
      continue;
    }
    if (writable) writable = Writable();
    if (!writable) return;
    int queued = Request::kQueued;
    if (r.phase.compare_exchange_strong(queued, Request::kSent)) {
      // A failed send leaves the caller to time out: the broker is unreachable either way.
      (void)protocol::SendMessage(socket_, nullptr, r.command, std::move(r.body), &r.frames);
    }
    unsent_.pop_front();
  }
}

void IoThread::RefuseTooLarge(Request& r, size_t bytes) {
  int queued = Request::kQueued;
  if (!r.phase.compare_exchange_strong(queued, Request::kSent)) return;
  awaiting_.erase(r.rid);
  if (!r.on_reply) return;
  std::string message = "a " + r.command + " of " + std::to_string(bytes) +
                        " bytes is over the broker's limit of " +
                        std::to_string(limits_.max_message_bytes) +
                        " bytes a message (its --max-message-bytes; set max_message_bytes to "
                        "it): not sent, as the broker would drop the connection without an answer";
  if (r.command == protocol::kSubmit)
    message += "; store big inputs in Redis (stored_input_bytes) or submit fewer jobs at once";
  RunCallback([&] {
    r.on_reply(Reply{std::string(protocol::kError),
                     protocol::EncodeError(r.rid, codes::kTooLarge, message)});
  });
}

bool IoThread::LimitsDue(Clock::time_point now) const {
  return limits_rid_ == 0 || (!unsent_.empty() && now >= limits_resend_at_);
}

void IoThread::SendLimits() {
  // A resend keeps the rid: whichever answer comes first is taken, the others are ignored.
  const int64_t rid = limits_rid_ != 0 ? limits_rid_ : NextRid();
  if (protocol::SendMessage(socket_, nullptr, protocol::kLimits, protocol::EncodeEmpty(rid)).ok()) {
    limits_rid_ = rid;  // else the next turn tries again
    limits_resend_at_ = Clock::now() + kLimitsResendEvery;
  }
}

void IoThread::OnLimits(const std::string& command, const msgpack::object& body) {
  protocol::BrokerLimits limits;
  if (command != protocol::kLimits || !protocol::DecodeLimits(body, &limits).ok()) {
    // ERROR unknown_command from a broker older than LIMITS, or an answer that cannot be read:
    // keep to the limits this client was configured with.
    limits = {options_.max_message_bytes, 0, protocol::kMaxJobsPerMessage};
  }
  limits_ = limits;
  broker_max_message_bytes_.store(limits.max_message_bytes);
  broker_max_jobs_per_message_.store(limits.max_jobs_per_message);
  broker_max_job_bytes_.store(limits.max_job_bytes);
}

void IoThread::ReceiveAll() {
  for (int i = 0; i < kMaxReceivesPerTurn; ++i) {
    protocol::Message m;
    Status s = protocol::RecvMessage(socket_, /*router=*/false, &m, /*dont_wait=*/true);
    if (s.code() == codes::kUnavailable) return;  // drained
    if (!s.ok()) continue;                        // not Ferry framing: dropped
    Dispatch(std::move(m.command), std::move(m.body));
  }
}

void IoThread::Dispatch(std::string command, zmq::message_t body) {
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(body.data(), body.size(), &oh).ok()) return;
  if (command == protocol::kFinished) {
    DeliverFinished(oh.get());
    return;
  }
  // Replies without a rid (an ERROR for a message the broker could not decode) cannot be
  // matched; their caller times out.
  int64_t rid = 0;
  if (!protocol::GetInt(oh.get(), "rid", &rid, 0).ok() || rid == 0) return;
  if (rid == limits_rid_ && limits_.max_message_bytes == 0) {
    OnLimits(command, oh.get());
    return;
  }
  auto it = awaiting_.find(rid);
  if (it == awaiting_.end()) return;  // forgotten and swept, or not ours
  std::shared_ptr<Request> request = std::move(it->second);
  awaiting_.erase(it);
  if (request->phase.load() == Request::kForgotten || !request->on_reply) return;
  RunCallback([&] { request->on_reply(Reply{std::move(command), std::move(body)}); });
}

void IoThread::DeliverFinished(const msgpack::object& body) {
  RunCallback([&] {
    std::vector<std::string> ids;
    protocol::InlineResults records;  // a malformed "results" map: just the ids
    if (!protocol::DecodeInlineResults(body, &records).ok()) records.clear();
    if (protocol::GetStringArray(body, "ids", &ids).ok() && options_.on_finished)
      options_.on_finished(ids, records);
  });
}

void IoThread::ReadMonitor() {
  handshake_watch_.ReadEvents(monitor_);
  if (handshake_watch_.disconnects() != disconnects_seen_) {
    // The next connection may be to another broker, or this one restarted with other flags:
    // ask again before sending anything on it.
    disconnects_seen_ = handshake_watch_.disconnects();
    limits_ = protocol::BrokerLimits{};
    limits_rid_ = 0;
    broker_max_message_bytes_.store(0);
    broker_max_jobs_per_message_.store(0);
    broker_max_job_bytes_.store(0);
  }
  std::lock_guard<std::mutex> lock(handshake_mu_);
  handshake_error_ = handshake_watch_.error();
}

void IoThread::SweepPending(Clock::time_point now) {
  next_sweep_ = now + kSweepEvery;
  // Requests whose callers gave up while nothing could be sent (no broker, or no LIMITS answer).
  unsent_.erase(std::remove_if(unsent_.begin(), unsent_.end(),
                               [](const std::shared_ptr<Request>& r) {
                                 return r->phase.load() == Request::kForgotten;
                               }),
                unsent_.end());
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    if (it->second->phase.load() == Request::kForgotten)
      it = awaiting_.erase(it);
    else
      ++it;
  }
}

// ---- result notices on the Redis subscription ------------------------------------------------

void IoThread::MaybeSubscribe() {
  if (!subscribe_due()) return;
  // A fresh channel for every subscription: nothing published for an earlier one can arrive on
  // it (e.g. inside the read that brings the SUBSCRIBE confirmation).
  const std::string channel =
      protocol::Keys(options_.redis_prefix).NotifyChannel(protocol::NewUuid());
  const Status s = protocol::RedisSubscriber::Connect(
      options_.redis, std::min(options_.redis_timeout_ms, kPushRetryMinMs), channel, &push_);
  if (!s.ok()) {
    push_.reset();
    push_backoff_ms_ = std::clamp(push_backoff_ms_ * 2, kPushRetryMinMs, kPushRetryMaxMs);
    const Clock::time_point retry_at = Clock::now() + milliseconds(push_backoff_ms_);
    push_retry_at_ns_.store(retry_at.time_since_epoch().count());
    return;
  }
  push_backoff_ms_ = 0;
  {
    std::lock_guard<std::mutex> lock(channel_mu_);
    channel_ = channel;
  }
  subscribed_.store(true);
  // Jobs submitted to the old channel after it failed and before the thread saw it: their
  // notices are gone, so their waits read Redis now.
  if (subscribed_before_ && options_.on_push_lost) RunCallback(options_.on_push_lost);
  subscribed_before_ = true;
}

void IoThread::ReadPush() {
  const Status s = push_->ReadAvailable([this](std::string_view payload) {
    msgpack::object_handle oh;
    if (protocol::UnpackMap(payload.data(), payload.size(), &oh).ok()) DeliverFinished(oh.get());
  });
  if (!s.ok()) DropPush();
}

void IoThread::DropPush() {
  push_.reset();
  subscribed_.store(false);
  {
    std::lock_guard<std::mutex> lock(channel_mu_);
    channel_.clear();
  }
  if (options_.on_push_lost) RunCallback(options_.on_push_lost);
}

}  // namespace ferry::client
