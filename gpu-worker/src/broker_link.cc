#include "broker_link.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <unordered_map>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/curve.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "ferry/runtime/thread_name.h"

namespace ferry::worker {
namespace {

// A received CHUNK: the message, the msgpack tree that points into it and its data frames (the
// attached inputs' bytes, which the jobs' tensors point into). Jobs share it.
struct ChunkHolder {
  zmq::message_t message;
  msgpack::object_handle handle;
  std::vector<zmq::message_t> frames;
};

// Microseconds until a moment, as poll's whole milliseconds: rounded up, never negative.
int64_t CeilMs(int64_t us) { return std::max<int64_t>((us + 999) / 1000, 0); }

constexpr int64_t kMaxPollMs = 100;         // how often the loop looks at the drain flag
constexpr int kMaxMessagesPerWakeup = 256;  // fairness between the socket and the outbox
constexpr int64_t kMaxReconnectIntervalUs = 32'000'000;

}  // namespace

BrokerLink::BrokerLink(zmq::context_t* context, Options options, JobQueue* queue,
                       ResultWriter* writer, Outbox* outbox, InputFetcher* fetcher)
    : context_(context),
      options_(std::move(options)),
      queue_(queue),
      writer_(writer),
      outbox_(outbox),
      fetcher_(fetcher) {}

BrokerLink::~BrokerLink() {
  if (thread_.joinable()) {
    RequestDrain();
    thread_.join();
  }
}

Status BrokerLink::Connect(std::unique_ptr<zmq::socket_t>* out) {
  try {
    auto dealer = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::dealer);
    dealer->set(zmq::sockopt::linger, 2000);  // let BYE get out on exit
    FERRY_RETURN_IF_ERROR(
        protocol::ApplyCurveClient(*dealer, options_.curve_server_public, options_.curve_secret));
    const std::string endpoint =
        "inproc://ferry-worker-link-monitor-" + std::to_string(++monitors_);
    if (zmq_socket_monitor(dealer->handle(), endpoint.c_str(), protocol::kHandshakeWatchEvents) ==
        0) {
      monitor_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(endpoint);
    }
    dealer->connect(options_.endpoint);
    *out = std::move(dealer);
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("broker endpoint " + options_.endpoint + ": " + e.what());
  }
  return Status::Ok();
}

std::string BrokerLink::HandshakeFailure() {
  if (!monitor_) return "";
  handshake_watch_.ReadEvents(*monitor_);
  return handshake_watch_.error();
}

Status BrokerLink::Start() {
  FERRY_RETURN_IF_ERROR(Connect(&dealer_));
  reconnect_interval_us_ = options_.heartbeat_ms * 1000;
  next_reconnect_us_ = protocol::NowMicros() + options_.heartbeat_ms * options_.liveness * 1000;
  SendReady();
  spdlog::info("worker {}: connecting to broker {}, capacity {}, {} model(s)",
               options_.hello.worker, options_.endpoint, options_.hello.capacity,
               options_.hello.models.size());
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void BrokerLink::Join() {
  if (thread_.joinable()) thread_.join();
}

void BrokerLink::Send(std::string_view command, zmq::message_t body) {
  Status s = protocol::SendMessage(*dealer_, nullptr, command, std::move(body));
  if (!s.ok()) spdlog::error("send {} to broker: {}", command, s.ToString());
}

bool BrokerLink::Writable() {
  try {
    return (dealer_->get(zmq::sockopt::events) & ZMQ_POLLOUT) != 0;
  } catch (const zmq::error_t&) {
    return false;
  }
}

void BrokerLink::SendReady() {
  protocol::WorkerHello hello = options_.hello_fn ? options_.hello_fn() : options_.hello;
  // At most capacity ids (the broker refuses more): it never sends more jobs than that.
  hello.held.clear();
  for (const auto& [id, copies] : held_ids_) {
    if (static_cast<int64_t>(hello.held.size()) >= hello.capacity) break;
    hello.held.push_back(id);
  }
  Send(protocol::kReady, protocol::EncodeHello(hello));
}

void BrokerLink::Reconnect() {
  std::unique_ptr<zmq::socket_t> fresh;
  if (Status s = Connect(&fresh); !s.ok()) {
    spdlog::error("reconnect to {}: {}", options_.endpoint, s.message());
    return;
  }
  try {
    dealer_->set(zmq::sockopt::linger, 0);  // whatever was queued for the dead broker is moot
  } catch (const zmq::error_t&) {
  }
  dealer_ = std::move(fresh);
  ++reconnects_;
  broker_heartbeat_ms_.store(0);  // the next broker says its own
  if (!draining_) SendReady();
}

void BrokerLink::MaybeReconnect(int64_t now_us) {
  const int64_t silence_us = SilenceMicros();
  const int64_t last = last_broker_us_.load();
  if (last != 0 && now_us - last < silence_us) {
    reconnect_interval_us_ = options_.heartbeat_ms * 1000;  // healthy: reset the backoff
    next_reconnect_us_ = last + silence_us;
    return;
  }
  if (now_us < next_reconnect_us_) return;
  const std::string why = HandshakeFailure();
  if (!why.empty())
    spdlog::error("worker {}: cannot join broker {}: {}", options_.hello.worker, options_.endpoint,
                  why);
  spdlog::warn("worker {}: broker {} silent for {} ms; reconnecting (next try in {} ms)",
               options_.hello.worker, options_.endpoint,
               last ? (now_us - last) / 1000 : silence_us / 1000, reconnect_interval_us_ / 1000);
  Reconnect();
  next_reconnect_us_ = now_us + reconnect_interval_us_;
  reconnect_interval_us_ = std::min(2 * reconnect_interval_us_, kMaxReconnectIntervalUs);
}

void BrokerLink::Loop() {
  runtime::NameThisThread("ferry-link");
  const int64_t heartbeat_us = options_.heartbeat_ms * 1000;
  int64_t next_heartbeat = protocol::MonotonicMicros() + heartbeat_us;
  protocol::Message m;
  while (true) {
    if (drain_requested_.load() && !draining_) {
      draining_ = true;
      spdlog::info("worker {}: draining, {} job(s) still to finish", options_.hello.worker,
                   outstanding_.load());
    }
    TakeOutbox();
    // Done draining: every job reported, and a last look at the socket found no new chunk.
    const bool may_finish = draining_ && outstanding_.load() == 0;

    const int64_t now = protocol::MonotonicMicros();
    if (hold_until_us_ != 0 && now >= hold_until_us_ && !draining_) SendHeld();
    int64_t wait_ms = std::min(CeilMs(next_heartbeat - now), kMaxPollMs);
    if (hold_until_us_ != 0 && !draining_)
      wait_ms = std::min(wait_ms, CeilMs(hold_until_us_ - now));
    if (may_finish || !outbox_->Sleeping()) wait_ms = 0;
    zmq_pollitem_t items[] = {{dealer_->handle(), 0, ZMQ_POLLIN, 0},
                              {nullptr, outbox_->fd(), ZMQ_POLLIN, 0}};
    const int poll_rc = protocol::PollSockets(items, 2, static_cast<long>(wait_ms));
    outbox_->Awake(poll_rc > 0 && (items[1].revents & ZMQ_POLLIN));
    if (poll_rc < 0) {
      if (zmq_errno() == ETERM) break;
      if (zmq_errno() != EINTR) spdlog::error("poll: {}", zmq_strerror(zmq_errno()));
      continue;
    }
    if (may_finish && !(items[0].revents & ZMQ_POLLIN)) break;
    if (items[0].revents & ZMQ_POLLIN) {
      for (int i = 0; i < kMaxMessagesPerWakeup; ++i) {
        Status s = protocol::RecvMessage(*dealer_, /*router=*/false, &m, /*dont_wait=*/true);
        if (s.code() == codes::kUnavailable) break;
        last_broker_us_.store(protocol::NowMicros());
        if (!s.ok()) {
          spdlog::warn("malformed message from the broker: {}", s.message());
          continue;
        }
        HandleBroker(&m);
      }
    }
    if (protocol::MonotonicMicros() >= next_heartbeat) {
      // Skipped while the broker is unreachable and the send queue is full: a blocking send
      // would stall this thread, and stale heartbeats are worthless anyway.
      if (Writable()) Send(protocol::kHeartbeat, protocol::EncodeEmpty());
      next_heartbeat = protocol::MonotonicMicros() + heartbeat_us;
      const int64_t last = last_broker_us_.load();
      const bool silent = last != 0 && protocol::NowMicros() - last > SilenceMicros();
      if (silent != broker_silent_) {
        broker_silent_ = silent;
        if (!silent) spdlog::info("broker {} heard from again", options_.endpoint);
      }
      MaybeReconnect(protocol::NowMicros());
    }
  }
  // The held DONEs say "bye": read alone, without the BYE behind them, their credit would be
  // given back to a worker that is leaving, and new work sent to it.
  SendHeld(/*bye=*/true);
  if (Writable()) Send(protocol::kBye, protocol::EncodeEmpty());
  spdlog::info("worker {}: drained after {} chunk(s), {} job(s); BYE sent", options_.hello.worker,
               chunks_, jobs_);
}

void BrokerLink::HandleBroker(protocol::Message* m) {
  if ((m->command == protocol::kChunk || m->command == protocol::kHeartbeat) &&
      !last_refusal_.empty()) {
    spdlog::info("worker {}: the broker took it", options_.hello.worker);
    SetRefusal("");
  }
  if (m->command == protocol::kChunk) {
    HandleChunk(std::move(m->body), std::move(m->frames));
  } else if (m->command == protocol::kReannounce) {
    if (draining_) return;  // leaving: take no new credit
    spdlog::info("broker asked worker {} to re-announce; sending READY", options_.hello.worker);
    SendReady();
  } else if (m->command == protocol::kCancel) {
    HandleCancel(m->body);
  } else if (m->command == protocol::kHeartbeat) {
    // Its arrival time is kept by the caller; the interval it says sets how long a silence
    // means a dead broker.
    if (const int64_t ms = protocol::DecodeHeartbeat(m->body); ms > 0)
      broker_heartbeat_ms_.store(ms);
  } else if (m->command == protocol::kError) {
    // The broker refused a READY (a worker name another key holds, with CURVE; limits the
    // worker checked at start make the rest unlikely): no work comes until one is taken. Said
    // once per reason, not at every re-announce.
    msgpack::object_handle oh;
    Status refused = Status::Internal("an ERROR that cannot be read");
    if (protocol::UnpackMap(m->body.data(), m->body.size(), &oh).ok())
      (void)protocol::DecodeError(oh.get(), &refused);
    if (protocol::Printable(refused.ToString(), 300) != last_refusal_) {
      SetRefusal(protocol::Printable(refused.ToString(), 300));
      spdlog::error("worker {}: the broker refused it: {}; it gets no work until it is taken",
                    options_.hello.worker, last_refusal_);
    }
  } else {
    spdlog::warn("unexpected command {} from the broker ignored", m->command);
  }
}

void BrokerLink::SetRefusal(std::string why) {
  last_refusal_ = why;
  std::lock_guard<std::mutex> lock(refusal_mu_);
  refusal_ = std::move(why);
}

void BrokerLink::HandleChunk(zmq::message_t body, std::vector<zmq::message_t> frames) {
  const int64_t received = protocol::NowMicros();
  auto holder = std::make_shared<ChunkHolder>();
  holder->message = std::move(body);
  holder->frames = std::move(frames);
  Status s = protocol::UnpackMap(holder->message.data(), holder->message.size(), &holder->handle);
  const msgpack::object* entries = s.ok() ? protocol::Find(holder->handle.get(), "jobs") : nullptr;
  if (!entries || entries->type != msgpack::type::ARRAY) {
    spdlog::error("CHUNK without a \"jobs\" array ignored ({})", s.ok() ? "no jobs" : s.message());
    return;
  }
  // Attached inputs take the data frames in order; when the counts differ, no job can trust
  // its frames, and each fails (the broker sent a broken CHUNK).
  const size_t attached = protocol::AttachedCount(*entries);
  const bool frames_match = attached == holder->frames.size();
  std::vector<Job> jobs;
  std::vector<JobResult> rejected;
  jobs.reserve(entries->via.array.size);
  size_t next_frame = 0;
  for (uint32_t i = 0; i < entries->via.array.size; ++i) {
    Job job;
    job.received_us = received;
    const size_t first_frame = next_frame;
    next_frame += protocol::AttachedInJob(entries->via.array.ptr[i]);
    Status d = protocol::DecodeChunkEntry(entries->via.array.ptr[i], &job.entry);
    if (d.ok() && !frames_match) {
      d = Status::InvalidArgument("the CHUNK has " + std::to_string(attached) +
                                  " attached input(s) and " +
                                  std::to_string(holder->frames.size()) + " data frame(s)");
    }
    if (d.ok()) {
      d = protocol::MatchFrames(&job.entry.inputs, holder->frames.data() + first_frame,
                                next_frame - first_frame);
    }
    if (d.ok()) {
      job.chunk = holder;
      jobs.push_back(std::move(job));
    } else if (!job.entry.id.empty()) {
      rejected.push_back(FailedResult(std::move(job), Status::InvalidArgument(d.message())));
    } else {
      spdlog::error("CHUNK entry {} has no id and cannot be reported: {}", i, d.message());
    }
  }
  const int64_t n = static_cast<int64_t>(jobs.size() + rejected.size());
  outstanding_.fetch_add(n);
  for (const auto& job : jobs) ++held_ids_[job.entry.id];
  for (const auto& result : rejected) ++held_ids_[result.job.entry.id];
  ++chunks_;
  jobs_ += n;
  if (!rejected.empty()) {
    spdlog::warn("CHUNK: {} undecodable job(s) failed (first: {}: {})", rejected.size(),
                 rejected.front().job.entry.id, rejected.front().status.message());
    writer_->Submit(std::move(rejected));
  }
  // Jobs whose inputs wait in Redis are read there first.
  std::vector<Job> to_fetch;
  for (auto it = jobs.begin(); it != jobs.end();) {
    if (it->entry.stored_inputs.empty()) {
      ++it;
      continue;
    }
    to_fetch.push_back(std::move(*it));
    it = jobs.erase(it);
  }
  if (!to_fetch.empty()) {
    if (fetcher_ != nullptr) {
      fetcher_->Submit(std::move(to_fetch));
    } else {
      std::vector<JobResult> failed;
      for (auto& job : to_fetch)
        failed.push_back(
            FailedResult(std::move(job), Status::Internal("this worker reads no stored inputs")));
      writer_->Submit(std::move(failed));
    }
  }
  const size_t accepted = jobs.size();
  if (!queue_->Push(std::move(jobs))) {
    spdlog::warn("broker sent more jobs than the announced capacity {} (queue {})",
                 options_.hello.capacity, queue_->size());
  }
  spdlog::debug("CHUNK of {} job(s) queued", accepted);
}

void BrokerLink::HandleCancel(const zmq::message_t& body) {
  std::vector<std::string> ids;
  msgpack::object_handle oh;
  Status s = protocol::UnpackMap(body.data(), body.size(), &oh);
  if (s.ok()) s = protocol::GetStringArray(oh.get(), "ids", &ids);
  if (!s.ok()) {
    spdlog::warn("malformed CANCEL from the broker ignored: {}", s.message());
    return;
  }
  // The fetcher first: a job it passes on meanwhile is in the queue by the time it returns.
  const size_t unfetched = fetcher_ != nullptr ? fetcher_->Cancel(ids) : 0;
  std::vector<Job> removed = queue_->Remove(ids);
  spdlog::info("worker {}: CANCEL for {} job(s): {} dropped before running", options_.hello.worker,
               ids.size(), unfetched + removed.size());
  if (removed.empty()) return;
  std::vector<JobResult> results;
  results.reserve(removed.size());
  for (auto& job : removed) results.push_back(CancelledResult(std::move(job)));
  writer_->Submit(std::move(results));
}

void BrokerLink::TakeOutbox() {
  std::vector<DoneReport> reports;
  bool ready = false;
  outbox_->TakeAll(&reports, &ready);
  if (ready && !draining_) SendReady();  // residency changed (not while leaving)
  for (auto& r : reports) HandleReport(std::move(r));
}

void BrokerLink::HandleReport(DoneReport report) {
  outstanding_.fetch_sub(static_cast<int64_t>(report.ids.size()));
  if (draining_) {
    Hold(std::move(report));
    return;
  }
  // A DONE of notified jobs only (then it carries no inline results) may wait a little.
  const size_t hold_limit = HeldIdsBound(options_.hello.capacity);
  const bool all_notified = !report.ids.empty() && report.notified.size() == report.ids.size();
  if (options_.done_hold_us > 0 && all_notified && report.ids.size() <= hold_limit) {
    if (held_.ids.size() + report.ids.size() > hold_limit) SendHeld();
    Hold(std::move(report));
    return;
  }
  SendHeld();  // what was held goes first
  SendDone(report);
}

void BrokerLink::Hold(DoneReport report) {
  if (held_.ids.empty()) hold_until_us_ = protocol::MonotonicMicros() + options_.done_hold_us;
  auto append = [](auto* to, auto& from) {
    to->insert(to->end(), std::make_move_iterator(from.begin()),
               std::make_move_iterator(from.end()));
  };
  append(&held_.ids, report.ids);
  held_.duplicates += report.duplicates;
  append(&held_.not_done, report.not_done);
  append(&held_.inline_results, report.inline_results);
  append(&held_.notified, report.notified);
}

void BrokerLink::SendHeld(bool bye) {
  if (!held_.ids.empty()) SendDone(held_, bye);
  held_ = DoneReport{};
  hold_until_us_ = 0;
}

void BrokerLink::SendDone(const DoneReport& report, bool bye) {
  for (const auto& id : report.ids) {
    auto held = held_ids_.find(id);
    if (held != held_ids_.end() && --held->second <= 0) held_ids_.erase(held);
  }
  auto send = [&](const DoneReport& r) {
    protocol::InlineResults results(r.inline_results.begin(), r.inline_results.end());
    Send(protocol::kDone,
         protocol::EncodeDone(r.ids, r.duplicates, r.not_done, results, r.notified, bye));
  };
  const size_t max_ids = protocol::kMaxMapEntries, max_bytes = protocol::kMaxDoneInlineBytes;
  size_t record_bytes = 0;
  for (const auto& entry : report.inline_results) record_bytes += entry.second.size();
  if (report.ids.size() <= max_ids && record_bytes <= max_bytes) return send(report);
  // More ids than a body's map may hold, or more inline records than one DONE should carry (a
  // big batch, or results that piled up while Redis was slow; the broker drops the connection
  // of a message over its limit, and the DONE with it): the ids in order, a new DONE after
  // kMaxMapEntries of them or kMaxDoneInlineBytes of their records, each DONE with its ids'
  // statuses, records and notices.
  std::unordered_map<std::string_view, size_t> record_of;  // id -> its record's size
  for (const auto& entry : report.inline_results)
    record_of.emplace(entry.first, entry.second.size());
  std::unordered_map<std::string_view, size_t> part_of;
  std::vector<DoneReport> split(1);
  size_t part_bytes = 0;
  for (const auto& id : report.ids) {
    auto rec = record_of.find(id);
    const size_t bytes = rec != record_of.end() ? rec->second : 0;
    if (!split.back().ids.empty() &&
        (split.back().ids.size() == max_ids || part_bytes + bytes > max_bytes)) {
      split.emplace_back();
      part_bytes = 0;
    }
    part_of.emplace(id, split.size() - 1);
    split.back().ids.push_back(id);
    part_bytes += bytes;
  }
  // A count, not ids: spread so that no part claims more than its ids (the broker caps it there).
  int64_t duplicates = report.duplicates;
  for (auto& p : split) {
    p.duplicates = std::min<int64_t>(duplicates, static_cast<int64_t>(p.ids.size()));
    duplicates -= p.duplicates;
  }
  auto part = [&](const std::string& id) -> DoneReport& {
    auto it = part_of.find(id);
    return split[it != part_of.end() ? it->second : 0];
  };
  for (const auto& entry : report.not_done) part(entry.first).not_done.push_back(entry);
  for (const auto& entry : report.inline_results) part(entry.first).inline_results.push_back(entry);
  for (const auto& id : report.notified) part(id).notified.push_back(id);
  for (const auto& part_report : split) send(part_report);  // each says bye: no credit back
}

}  // namespace ferry::worker
