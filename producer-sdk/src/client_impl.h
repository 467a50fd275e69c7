#pragma once
// Client::Impl, the producer SDK behind include/ferry/client.h, in two files: client.cc (creation,
// Stats, Cancel, and Client's forwarding) and client_submit.cc (the submit path: SubmitMany and
// Run, big inputs stored in Redis, SUBMITs encoded and their verdicts read).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/client.h"
#include "ferry/protocol/keys.h"
#include "ferry/protocol/redis.h"
#include "frame_pool.h"
#include "io_thread.h"
#include "job_check.h"
#include "redis_store.h"
#include "result_deleter.h"
#include "result_tracker.h"

namespace ferry::client {

// The reply to a request, decoded: ERROR becomes its status; anything but `expected` is a bug
// (client.cc).
Status CheckReply(const IoThread::Reply& reply, std::string_view expected,
                  msgpack::object_handle* body);

class Client::Impl {
 public:
  // Result notices come straight from workers (ClientOptions::push_results) only for SUBMITs
  // after which at most this many of this client's jobs are tracked: at light load that saves
  // the DONE and FINISHED hops through the broker; under load batching amortizes them, and the
  // extra PUBLISH per job would only cost Redis CPU.
  static constexpr size_t kPushMaxTracked = 64;

  Impl(const ClientOptions& options, protocol::RedisEndpoint redis)
      : options_(options),
        redis_(std::move(redis)),
        keys_(options.redis_prefix),
        store_(redis_, options.redis_prefix, options.request_timeout_ms),
        tracker_(
            [this](const std::string& id, int timeout_ms, Result* out) {
              return store_.Read(id, out, options_.consume_results, timeout_ms);
            },
            // consume_results: a result that came inline (in a notice) is still in Redis;
            // delete it too, in the background (result_deleter.h).
            [this](const std::string& id) {
              if (options_.consume_results) deleter_.Add(id);
            }) {}

  Status Start() {
    IoThread::Options o;
    o.frontend = options_.frontend;
    o.curve_server_public = options_.curve_server_public;
    o.curve_secret = options_.curve_secret;
    o.push_results = options_.push_results;
    o.redis = redis_;
    o.redis_prefix = options_.redis_prefix;
    o.redis_timeout_ms = options_.request_timeout_ms;
    o.max_message_bytes = options_.max_message_bytes;
    o.on_finished = [this](const std::vector<std::string>& ids,
                           const protocol::InlineResults& records) {
      tracker_.Notify(ids, records);
    };
    // Notices published while a subscription was failing are gone, and the broker sends no
    // FINISHED for those jobs: their Waits read Redis now instead of at the slow re-check.
    o.on_push_lost = [this] { tracker_.RecheckOurs(); };
    return IoThread::Start(std::move(o), &io_);
  }

  // Jobs by pointer so that Submit(job) need not copy the job's tensors.
  Status SubmitMany(const std::vector<const Job*>& jobs, std::vector<SubmitOutcome>* outcomes);
  Status Wait(const std::string& id, int timeout_ms, Result* out) {
    return tracker_.Wait(id, timeout_ms, out);
  }
  Status Run(const Job& job, int timeout_ms, Result* out, std::string* id);
  Status Stats(std::string* json);
  Status Cancel(const std::vector<std::string>& ids, CancelReport* report);
  // The most bytes and jobs (or ids) one SUBMIT (or CANCEL) may carry: the SDK's own limits, or
  // the broker's from LIMITS where lower (read again for each message: they may arrive meanwhile).
  std::pair<size_t, size_t> MessageLimits() const;
  Status Poll(const std::string& id, Result* out) {
    if (!protocol::IsValidJobId(id))
      return Status::InvalidArgument("job id \"" + id + "\" is not a valid Ferry id");
    return store_.Read(id, out);
  }

 private:
  // The SUBMIT body for jobs[i], i in `part`, with ids from *outcomes; `ack` false asks the
  // broker to answer only rejections. Tracks the ids first (a result may come before any
  // reply).
  // Inputs that are neither stored nor small are attached: their bytes are copied once, into
  // *frames (one data frame each, in order), and the body names them.
  zmq::message_t EncodeSubmit(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                              const std::vector<SubmitOutcome>& outcomes, int64_t rid, bool ack,
                              std::vector<zmq::message_t>* frames);
  // The channel the next SUBMIT names ("" = none); `tracked` is how many of this client's jobs
  // the tracker holds, the SUBMIT's own included. Only at light load; the first such SUBMIT (and
  // the first after the subscription failed and its back-off passed) has the I/O thread
  // subscribe first, and waits for that (at most min(request_timeout_ms, 1 s)).
  std::string NotifyChannel(size_t tracked);
  // Whether input `t` goes to Redis rather than inside the SUBMIT
  // (ClientOptions::stored_input_bytes).
  bool Stored(const Tensor& t) const { return IsStored(t, options_.stored_input_bytes); }
  // Whether input `t` travels in a data frame of its own (ClientOptions::attached_input_bytes).
  bool Attached(const Tensor& t) const {
    return !Stored(t) && options_.attached_input_bytes > 0 &&
           t.data.size() >= static_cast<size_t>(options_.attached_input_bytes);
  }
  // Whether the SDK made `job`'s id (none was given), so that no other job can have it. The
  // stored inputs of a job whose SUBMIT never reached the broker are deleted only then: a
  // caller's id may be a pending job's, submitted before (a retry), whose inputs those keys are.
  static bool OwnId(const Job& job) { return job.id.empty(); }
  // The Redis keys of `job`'s stored inputs, appended to *keys.
  void AppendInputKeys(const Job& job, const std::string& id, std::vector<std::string>* keys) const;
  // Writes the stored inputs of jobs[i], i in `part` (one round trip, within `timeout_ms` when
  // > 0 and shorter than request_timeout_ms), before their SUBMIT. When that fails, deletes those
  // of jobs with OwnId again (some may have been written).
  Status StoreInputs(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                     const std::vector<SubmitOutcome>& outcomes, int timeout_ms = 0);
  // Sends items 0..count-1 in as few messages as the limits allow (MessageLimits, read again for
  // each message): at most its count of items, and `header_bytes` plus their `item_bytes` under
  // its bytes (an item bigger alone goes alone). `send(begin, end)` sends items [begin, end) as
  // one message. One refused too_large because the broker's limits came meanwhile (its LIMITS
  // answer follows each connect) is split again under them, at most 3 times a call: limits that
  // change at every answer cannot loop for ever. Returns the first error of `send`, with
  // *stopped_at the first item not sent (count when all went).
  Status SendInParts(size_t count, size_t header_bytes,
                     const std::function<size_t(size_t)>& item_bytes,
                     const std::function<Status(size_t, size_t)>& send, size_t* stopped_at);
  // Sends jobs[i] for i in `part` as one SUBMIT and records each verdict in *outcomes.
  Status SubmitOne(const std::vector<const Job*>& jobs, const std::vector<size_t>& part,
                   std::vector<SubmitOutcome>* outcomes);

  const ClientOptions options_;
  const protocol::RedisEndpoint redis_;
  const protocol::Keys keys_;
  RedisStore store_;
  FramePool frames_;  // buffers of attached inputs' frames
  // After store_, which it uses; before tracker_, which calls it.
  ResultDeleter deleter_{&store_};
  // Before io_: the I/O thread calls into it until io_'s destructor has joined the thread.
  ResultTracker tracker_;
  std::unique_ptr<IoThread> io_;
};

}  // namespace ferry::client
