#pragma once
// ScriptedFrontend: a stand-in for the broker's frontend in the SDK's unit tests -- a real ROUTER
// socket on a free port, run by its own thread, speaking wire protocol v1 through the protocol
// library. It accepts jobs for model "m" and rejects other models as unknown_model, answers LIMITS
// (set_max_message_bytes; set_lose_limits to leave the first ones unanswered; a SUBMIT of more
// jobs than the constructor's max_jobs_per_message gets ERROR too_large) and STATS, sends
// FINISHED on request (Finish), and can echo every accepted job back at once (set_echo) or answer
// everything with ERROR (set_error_reply). Like the broker, it sends no ACCEPTED for a SUBMIT with
// "ack": false whose jobs were all accepted.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"

namespace ferry::client_test {

// A frontend ROUTER on a free port, run by its own thread.
class ScriptedFrontend {
 public:
  explicit ScriptedFrontend(int port, int64_t max_jobs_per_message = protocol::kMaxJobsPerMessage)
      : endpoint_("tcp://127.0.0.1:" + std::to_string(port)),
        max_jobs_per_message_(max_jobs_per_message) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint_);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedFrontend() {
    stop_ = true;
    thread_.join();
  }
  // Sends FINISHED {"ids": ids, "results"?: records} to the producer that last submitted.
  void Finish(std::vector<std::string> ids,
              std::vector<std::pair<std::string, std::string>> records = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    to_finish_.push_back({std::move(ids), std::move(records)});
  }
  int submits() const { return submits_; }
  // SUBMITs that said "ack": false (answered only when a job was rejected).
  int unacked_submits() const { return unacked_submits_; }
  // Whether the last SUBMIT asked for inline results ("inline_results": true).
  bool asked_inline() const { return asked_inline_; }
  // The last SUBMIT's "notify" channel ("" when it named none).
  std::string notify() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notify_;
  }
  int jobs_seen() const { return jobs_seen_; }
  // Job inputs the SUBMITs named as stored in Redis ("stored": true) rather than carried.
  int stored_inputs() const { return stored_inputs_; }
  void set_error_reply(bool on) { error_reply_ = on; }
  // What LIMITS answers as "max_message_bytes" (it does not enforce it), and as
  // "max_job_bytes" unless set_max_job_bytes says otherwise.
  void set_max_message_bytes(int64_t n) { max_message_bytes_ = n; }
  void set_max_job_bytes(int64_t n) { max_job_bytes_ = n; }
  // Leaves the next `n` LIMITS unanswered, as if they were lost on a connection that dropped.
  void set_lose_limits(int n) { lose_limits_ = n; }
  // The commands received, in order.
  std::vector<std::string> commands() const {
    std::lock_guard<std::mutex> lock(mu_);
    return commands_;
  }
  // The rids of the LIMITS received, in order.
  std::vector<int64_t> limits_rids() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limits_rids_;
  }
  // Answers every accepted job at once: FINISHED right after ACCEPTED, with an inline "done"
  // record whose one output is the job's first input (an echo).
  void set_echo(bool on) { echo_ = on; }
  // Answers "ack": false SUBMITs with ACCEPTED anyway, as a broker from before "ack" does.
  void set_ignore_ack(bool on) { ignore_ack_ = on; }

 private:
  void Run() {
    while (!stop_) {
      zmq_pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [ids, records] : to_finish_) {
          protocol::InlineResults views(records.begin(), records.end());
          protocol::SendTo(socket_, producer_, protocol::kFinished,
                           protocol::EncodeFinished(ids, views));
        }
        to_finish_.clear();
      }
      protocol::Message m;
      if (!protocol::RecvMessage(socket_, /*router=*/true, &m).ok()) continue;
      std::string peer(m.envelope.at(0).to_string_view());
      {
        std::lock_guard<std::mutex> lock(mu_);
        commands_.push_back(m.command);
      }
      msgpack::object_handle oh;
      if (!protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok()) continue;
      int64_t rid = 0;
      protocol::GetInt(oh.get(), "rid", &rid, 0);
      if (error_reply_) {
        protocol::SendTo(socket_, peer, protocol::kError,
                         protocol::EncodeError(rid, codes::kMalformed, "scripted error"));
      } else if (m.command == protocol::kSubmit) {
        ++submits_;
        const msgpack::object* all = protocol::Find(oh.get(), "jobs");
        if (all && all->type == msgpack::type::ARRAY &&
            all->via.array.size > max_jobs_per_message_) {
          protocol::SendTo(socket_, peer, protocol::kError,
                           protocol::EncodeError(rid, codes::kTooLarge, "too many jobs"));
          continue;
        }
        const msgpack::object* flag = protocol::Find(oh.get(), "inline_results");
        asked_inline_ = flag && flag->type == msgpack::type::BOOLEAN && flag->via.boolean;
        const msgpack::object* ack = protocol::Find(oh.get(), "ack");
        const bool quiet = ack && ack->type == msgpack::type::BOOLEAN && !ack->via.boolean;
        if (quiet) ++unacked_submits_;
        const bool silent = quiet && !ignore_ack_;
        const msgpack::object* notify = protocol::Find(oh.get(), "notify");
        {
          std::lock_guard<std::mutex> lock(mu_);
          producer_ = peer;
          notify_ = notify ? std::string(protocol::AsStringView(*notify)) : "";
        }
        protocol::Accepted a;
        a.rid = rid;
        std::vector<std::pair<std::string, std::string>> echoes;
        const msgpack::object* jobs = protocol::Find(oh.get(), "jobs");
        for (uint32_t i = 0; jobs && i < jobs->via.array.size; ++i) {
          ++jobs_seen_;
          protocol::SubmitJob job;
          Status s = protocol::DecodeSubmitJob(jobs->via.array.ptr[i], &job);
          for (const auto& t : job.inputs) stored_inputs_ += t.stored ? 1 : 0;
          if (s.ok() && job.model != "m") s = Status(codes::kUnknownModel, "no worker serves it");
          if (s.ok())
            a.ids.push_back(job.id);
          else
            a.rejected.push_back({job.id, s.code(), s.message()});
          if (s.ok() && echo_ && !job.inputs.empty()) {
            protocol::ResultRecord r;
            r.id = job.id;
            r.status = "done";
            r.model = job.model;
            r.outputs.push_back(job.inputs[0]);
            msgpack::sbuffer buf;
            protocol::Packer pk(buf);
            protocol::PackResult(pk, r);
            echoes.emplace_back(job.id, std::string(buf.data(), buf.size()));
          }
        }
        if (!silent || !a.rejected.empty())  // "ack": false -- answer rejections only
          protocol::SendTo(socket_, peer, protocol::kAccepted, protocol::EncodeAccepted(a));
        if (!echoes.empty()) {
          protocol::InlineResults views(echoes.begin(), echoes.end());
          protocol::SendTo(socket_, peer, protocol::kFinished,
                           protocol::EncodeFinished(a.ids, views));
        }
      } else if (m.command == protocol::kLimits) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          limits_rids_.push_back(rid);
        }
        if (lose_limits_ > 0) {
          --lose_limits_;
          continue;
        }
        protocol::SendTo(socket_, peer, protocol::kLimits,
                         protocol::EncodeLimits({max_message_bytes_,
                                                 max_job_bytes_ > 0 ? max_job_bytes_.load()
                                                                    : max_message_bytes_.load(),
                                                 max_jobs_per_message_},
                                                rid));
      } else if (m.command == protocol::kStats) {
        msgpack::sbuffer buf;
        protocol::Packer pk(buf);
        pk.pack_map(3);
        protocol::PackString(pk, "queues");
        pk.pack_map(1);
        protocol::PackString(pk, "m");
        pk.pack_int64(3);
        protocol::PackString(pk, "workers");
        pk.pack_array(0);
        protocol::PackString(pk, "rid");
        pk.pack_int64(rid);
        protocol::SendTo(socket_, peer, protocol::kStats, protocol::ToMessage(std::move(buf)));
      }
    }
  }

  std::string endpoint_;
  const int64_t max_jobs_per_message_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::router};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> submits_{0};
  std::atomic<int> unacked_submits_{0};
  std::atomic<int> jobs_seen_{0};
  std::atomic<int> stored_inputs_{0};
  std::atomic<bool> error_reply_{false};
  std::atomic<bool> ignore_ack_{false};
  std::atomic<bool> asked_inline_{false};
  std::atomic<bool> echo_{false};
  std::atomic<int64_t> max_message_bytes_{int64_t{1} << 30};
  std::atomic<int64_t> max_job_bytes_{0};  // 0: max_message_bytes_
  std::atomic<int> lose_limits_{0};
  mutable std::mutex mu_;
  std::vector<std::string> commands_;  // guarded by mu_
  std::vector<int64_t> limits_rids_;   // guarded by mu_
  std::string producer_;               // guarded by mu_
  std::string notify_;                 // guarded by mu_
  struct Notice {
    std::vector<std::string> ids;
    std::vector<std::pair<std::string, std::string>> records;
  };
  std::vector<Notice> to_finish_;  // guarded by mu_
};

}  // namespace ferry::client_test
