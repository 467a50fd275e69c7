#pragma once
// Scheduler: the broker's state and its dispatch policy, with no sockets -- per-model priority
// queues, the worker registry with credit and in-flight jobs, and the choice of which worker
// gets which chunk. Owned by the broker's one thread; not thread-safe by design.
//
// Dispatch: a worker announces a capacity (its credit when idle). A chunk goes to the least
// recently served worker that has credit and serves a model with queued jobs; it holds up to
// min(credit, that model's max_batch) jobs, highest priority first, FIFO within a priority.
// Credit comes back one per job when the worker reports it DONE.
//
// Warm workers first: a model goes to a worker that has it resident (READY "resident"), so that
// workers under a memory budget do not thrash loading and evicting. A worker takes a model it
// does not have warm only when no worker with credit has it warm (load spills over to cold
// workers once the warm ones are full) or when no worker has it warm at all (someone must load
// it; it then competes by priority and age like any other model).
//
// Starvation: strict priority alone could starve low priorities forever under sustained
// high-priority load, so every `aging_every`-th chunk of a model is taken oldest-first across all
// priorities. Low priorities therefore get at least 1/aging_every of the dispatches while they
// wait, and FIFO order still holds within each priority.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"
#include "job.h"

namespace ferry::broker {

struct WorkerState {
  std::string routing_id;
  std::string key;  // with CURVE: the public key its connection was admitted with
  protocol::WorkerHello hello;
  std::map<std::string, int64_t> max_batch;  // model -> max batch
  // Job ids it runs. One taken on another's word (Take) stays until this worker's own DONE
  // names it: the worker still runs it, so its credit comes back only then.
  std::set<std::string> in_flight;
  int64_t last_seen_us = 0;  // monotonic
  bool leaving = false;      // said bye (draining): no more work, while its last DONEs come in
  int64_t credit() const {
    return leaving ? 0 : hello.capacity - static_cast<int64_t>(in_flight.size());
  }
  // True when the worker has the model loaded and warm (a READY without "resident": all).
  bool IsWarm(const std::string& model) const;
};

struct Chunk {
  std::string worker;      // routing id
  std::vector<Job*> jobs;  // owned by the scheduler; valid until Complete/Remove
};

struct SchedulerCounters {
  int64_t accepted = 0;
  int64_t duplicates = 0;  // results that lost the race to an earlier one (fenced by SET NX)
  int64_t expired = 0;
  int64_t cancelled = 0;
  int64_t poisoned = 0;
  int64_t rejected = 0;
  int64_t finished = 0;
  int64_t requeued = 0;
  int64_t chunks = 0;
  int64_t dispatched = 0;
};

class Scheduler {
 public:
  explicit Scheduler(int64_t aging_every = 8) : aging_every_(aging_every) {}

  // Adds an accepted job, numbered (seq) after every job before it. Fails with kDuplicate when
  // the id is pending. A `parked` job is pending but in no queue: no chunk takes it, and it
  // leaves only by Claim, Take or TakeParked (it counts in QueueDepth all the same: it waits).
  Status Add(std::unique_ptr<Job> job, bool parked = false);
  // Adds a job restored from the journal, as Add but not counted as accepted, keeping the
  // number its record holds (they come in that order) unless a job added before has it. Its
  // record keeps that number when it is written again (Journal::Restage), and the jobs added
  // from now on are numbered after it: so the next restart, which orders the records by
  // number, keeps the order of acceptance. (Numbering restored jobs afresh put a requeued one,
  // written again with its new number, behind older ones whose records kept their old numbers.)
  Status AddRestored(std::unique_ptr<Job> job, bool parked);
  bool IsPending(const std::string& id) const { return jobs_.count(id) != 0; }
  // True once any worker has announced the model (since this broker started, or as restored
  // from the journal by AddKnownModel).
  bool KnowsModel(const std::string& model) const { return known_models_.count(model) != 0; }
  void AddKnownModel(const std::string& model) { known_models_.insert(model); }
  // The input specs a model's jobs are checked against at admission (READY "inputs"): the
  // distinct specs of the workers that serve it now, the latest announcer's first. A job is
  // admitted when it matches any of them, so both generations of a rolling upgrade are served.
  // Empty (or null, for a model no worker announced) means unchecked: no worker declared a
  // spec, or one that serves the model declared none. When the last worker serving a model
  // leaves, its specs stay until a worker announces the model again (jobs queued meanwhile are
  // still checked).
  using InputSpecs = std::vector<protocol::InputSpec>;
  const std::vector<InputSpecs>* SpecsOf(const std::string& model) const {
    auto it = specs_.find(model);
    return it == specs_.end() ? nullptr : &it->second;
  }
  const Job* Find(const std::string& id) const;
  // The ids of every pending job (queued, parked or dispatched), in no order.
  std::vector<std::string> PendingIds() const;

  // Registers (or re-registers) a worker. A re-announce of a known routing id keeps its jobs.
  void AddWorker(const std::string& routing_id, protocol::WorkerHello hello, int64_t now_us,
                 const std::string& key = "");
  bool HasWorker(const std::string& routing_id) const { return workers_.count(routing_id) != 0; }
  // A draining worker (a DONE with "bye"): it gets no more chunks.
  void MarkLeaving(const std::string& routing_id);
  void Touch(const std::string& routing_id, int64_t now_us);
  // The worker says it still holds these jobs (READY "held": it reconnected, to a restarted
  // broker or after being dropped as silent). Each id goes into its in_flight, so its credit
  // counts them until its DONE names them (ids already there change nothing, and none past its
  // capacity is taken). A job of a model it serves that is queued, parked, or dispatched to an
  // older connection of the same worker name becomes dispatched to it, so that it is neither
  // sent elsewhere nor expired nor requeued while the worker runs it. A job dispatched to
  // another worker stays there (both run it; the first result wins). Returns how many jobs it
  // took over; `were_waiting` (may be null) gets those of them that were queued or parked, now
  // dispatched (counted in counters().dispatched).
  size_t Claim(const std::string& routing_id, const std::vector<std::string>& ids,
               std::vector<const Job*>* were_waiting = nullptr);
  // Removes a worker; its in-flight jobs go back to the front of their queues, with attempt+1
  // when `spend_attempt` (not for jobs that never reached it: its BYE).
  // Returns the requeued jobs; the caller counts them (counters().requeued), less those it
  // poisons (counters().poisoned).
  std::vector<Job*> RemoveWorker(const std::string& routing_id, bool spend_attempt = true);
  // Workers silent at `now_us` (monotonic) for more than `liveness` heartbeats: of `heartbeat_us`
  // (the broker's), or of the longer interval a worker announced in its READY.
  std::vector<std::string> SilentWorkers(int64_t now_us, int64_t heartbeat_us,
                                         int64_t liveness) const;

  // A worker reports these jobs finished: their results are in Redis. Returns the jobs it holds
  // (dispatched to this routing id), removed from the scheduler. The other ids that are pending
  // -- a job requeued after its worker was presumed dead, running elsewhere, or a DONE from a
  // connection that never held it -- go to *not_held: the caller finishes them only once it has
  // seen their result in Redis (a DONE is a claim, not a proof). Every id named leaves the
  // worker's in_flight (its credit comes back): it no longer runs that job, whatever became of
  // it (taken on another's word, or its id reused by a newer job). Unknown ids are ignored.
  std::vector<std::unique_ptr<Job>> Complete(const std::string& routing_id,
                                             const std::vector<std::string>& ids,
                                             std::vector<std::string>* not_held);
  // Removes a job wherever it is (queued or dispatched); null when not pending. A dispatched
  // job's id stays in its worker's in_flight, holding that credit until the worker's DONE names
  // it (Complete) or the worker is removed: the worker still runs it.
  std::unique_ptr<Job> Take(const std::string& id);
  // Removes and returns queued jobs whose deadline is before `now_us` (wall clock).
  std::vector<std::unique_ptr<Job>> TakeExpired(int64_t now_us);
  // Removes and returns the parked jobs (the broker expires them when no worker claimed them).
  std::vector<std::unique_ptr<Job>> TakeParked();
  size_t parked() const { return parked_.size(); }  // (also in QueueDepth: they wait)
  size_t ParkedOf(const std::string& model) const;  // those of `model`
  // Removes and returns every queued job of `model` (its dispatched jobs stay): for a model
  // that has had no worker too long (orphan_watch.h).
  std::vector<std::unique_ptr<Job>> TakeQueued(const std::string& model);
  // Total bytes of the inputs of pending jobs: those in the broker's memory, and those their
  // producers stored in Redis.
  int64_t pending_bytes() const { return pending_bytes_; }

  // The next chunk to send, or false when no worker with credit serves a queued model.
  bool NextChunk(Chunk* out);

  // Jobs of `model` waiting for a worker: queued or parked (admission's max_queue, the metric).
  size_t QueueDepth(const std::string& model) const;
  // `submitted_us` of the model's oldest waiting job, queued or parked (0 when none waits).
  int64_t OldestQueuedSubmittedUs(const std::string& model) const;
  std::map<std::string, size_t> QueueDepths() const;
  const std::unordered_map<std::string, WorkerState>& workers() const { return workers_; }
  const std::set<std::string>& known_models() const { return known_models_; }
  size_t pending() const { return jobs_.size(); }
  // Queued jobs with a deadline (TakeExpired's index), for tests.
  size_t deadlines() const { return deadlines_.size(); }
  const SchedulerCounters& counters() const { return counters_; }
  SchedulerCounters& mutable_counters() { return counters_; }

 private:
  using PriorityQueue = std::map<int64_t, std::deque<Job*>, std::greater<int64_t>>;
  void Enqueue(Job* job, bool front);
  // The queued job a worker should serve next (highest priority, then oldest), or null.
  // With `warm_only`, only models eligible without a cold load: warm on `w`, or warm nowhere.
  PriorityQueue* BestQueueFor(const WorkerState& w, bool warm_only, std::string* model);
  bool WarmSomewhere(const std::string& model) const;

  // The queue level holding the oldest job (lowest seq), for aging.
  static PriorityQueue::iterator OldestLevel(PriorityQueue& pq);
  void Unqueue(Job* job);
  // A parked job waits in parked_, not in a queue; QueueDepth counts it as it counts the queued.
  void Park(Job* job);
  void Unpark(Job* job);
  // Removes `job`'s entry from deadlines_ (it leaves the queue): a job that finished or went to
  // a worker holds none, so deadlines_ stays as big as the queue, and an id accepted again
  // cannot be expired by its earlier job's deadline.
  void Undeadline(const Job* job);
  // Recomputes specs_ for `models` from the registered workers; `first` (may be null) is the
  // routing id of the worker whose specs go first.
  void RefreshSpecs(const std::set<std::string>& models, const std::string* first);

  std::unordered_map<std::string, std::unique_ptr<Job>> jobs_;
  std::set<std::string> parked_;  // ids of the parked jobs
  // (deadline, Job::seq) -> id, of the queued jobs with a deadline: keyed uniquely, so that a job
  // leaving the queue finds its entry in O(log n) (every job of one SUBMIT has the same deadline).
  std::map<std::pair<int64_t, int64_t>, std::string> deadlines_;
  std::unordered_map<std::string, int64_t> chunks_by_model_;
  int64_t aging_every_;
  int64_t pending_bytes_ = 0;
  std::unordered_map<std::string, PriorityQueue> queues_;  // model -> queue
  std::unordered_map<std::string, size_t> depth_;          // model -> queued and parked count
  std::unordered_map<std::string, WorkerState> workers_;
  std::list<std::string> lru_;  // routing ids, least recently served first
  std::set<std::string> known_models_;
  std::unordered_map<std::string, std::vector<InputSpecs>> specs_;  // model -> see SpecsOf
  SchedulerCounters counters_;
  int64_t next_seq_ = 0;
};

}  // namespace ferry::broker
