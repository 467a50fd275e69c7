#pragma once
// Scheduler: the broker's state and its dispatch policy, with no sockets -- per-model priority
// queues, the worker registry with credit and in-flight jobs, and the choice of which worker
// gets which chunk. Owned by the broker's one thread; not thread-safe by design.
//
// Dispatch: a worker announces a capacity (its credit when idle). A chunk goes to the least
// recently served worker that has credit and serves a model with queued jobs; it holds up to
// min(credit, that model's max_batch) jobs, highest priority first, FIFO within a priority.
// Credit comes back one per job when the worker reports it DONE.

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/broker/job.h"
#include "ferry/protocol/messages.h"
#include "ferry/status.h"

namespace ferry::broker {

struct WorkerState {
  std::string routing_id;
  protocol::WorkerHello hello;
  std::map<std::string, int64_t> max_batch;  // model -> max batch
  std::set<std::string> in_flight;           // job ids
  int64_t last_seen_us = 0;                  // monotonic
  int64_t credit() const { return hello.capacity - static_cast<int64_t>(in_flight.size()); }
};

struct Chunk {
  std::string worker;       // routing id
  std::vector<Job*> jobs;   // owned by the scheduler; valid until Complete/Remove
};

struct SchedulerCounters {
  int64_t accepted = 0;
  int64_t rejected = 0;
  int64_t finished = 0;
  int64_t requeued = 0;
  int64_t chunks = 0;
  int64_t dispatched = 0;
};

class Scheduler {
 public:
  // Adds an accepted job. Fails with kDuplicate when the id is pending.
  Status Add(std::unique_ptr<Job> job);
  bool IsPending(const std::string& id) const { return jobs_.count(id) != 0; }
  // True once any worker has announced the model (since this broker started).
  bool KnowsModel(const std::string& model) const { return known_models_.count(model) != 0; }

  // Registers (or re-registers) a worker. A re-announce of a known routing id keeps its jobs.
  void AddWorker(const std::string& routing_id, protocol::WorkerHello hello, int64_t now_us);
  bool HasWorker(const std::string& routing_id) const { return workers_.count(routing_id) != 0; }
  void Touch(const std::string& routing_id, int64_t now_us);
  // Removes a worker; its in-flight jobs go back to the front of their queues with attempt+1.
  // Returns the requeued jobs.
  std::vector<Job*> RemoveWorker(const std::string& routing_id);
  // Workers silent since before `deadline_us` (monotonic).
  std::vector<std::string> SilentWorkers(int64_t deadline_us) const;

  // The worker reports these jobs finished (results are in Redis). Returns the finished jobs,
  // removed from the scheduler (ids it does not hold are ignored).
  std::vector<std::unique_ptr<Job>> Complete(const std::string& routing_id,
                                             const std::vector<std::string>& ids);
  // Removes a job that was failed by the broker itself (e.g. poisoned).
  std::unique_ptr<Job> Take(const std::string& id);

  // The next chunk to send, or false when no worker with credit serves a queued model.
  bool NextChunk(Chunk* out);

  size_t QueueDepth(const std::string& model) const;
  std::map<std::string, size_t> QueueDepths() const;
  const std::unordered_map<std::string, WorkerState>& workers() const { return workers_; }
  const std::set<std::string>& known_models() const { return known_models_; }
  size_t pending() const { return jobs_.size(); }
  const SchedulerCounters& counters() const { return counters_; }
  SchedulerCounters& mutable_counters() { return counters_; }

 private:
  using PriorityQueue = std::map<int64_t, std::deque<Job*>, std::greater<int64_t>>;
  void Enqueue(Job* job, bool front);
  // The queued job a worker should serve next (highest priority, then oldest), or null.
  PriorityQueue* BestQueueFor(const WorkerState& w, std::string* model);

  std::unordered_map<std::string, std::unique_ptr<Job>> jobs_;
  std::unordered_map<std::string, PriorityQueue> queues_;  // model -> queue
  std::unordered_map<std::string, size_t> depth_;          // model -> queued count
  std::unordered_map<std::string, WorkerState> workers_;
  std::list<std::string> lru_;  // routing ids, least recently served first
  std::set<std::string> known_models_;
  SchedulerCounters counters_;
  int64_t next_seq_ = 0;
};

}  // namespace ferry::broker
