#include "scheduler.h"

#include <algorithm>

namespace ferry::broker {

Status Scheduler::Add(std::unique_ptr<Job> job, bool parked) {
  if (jobs_.count(job->id)) return Status(codes::kDuplicate, "a job with this id is pending");
  job->seq = next_seq_++;
  job->phase = parked ? JobPhase::kParked : JobPhase::kQueued;
  Job* raw = job.get();
  pending_bytes_ +=
      static_cast<int64_t>(raw->inputs_raw.size()) + raw->stored_bytes + raw->attached_bytes;
  jobs_.emplace(job->id, std::move(job));
  if (parked)
    Park(raw);
  else
    Enqueue(raw, /*front=*/false);
  ++counters_.accepted;
  return Status::Ok();
}

Status Scheduler::AddRestored(std::unique_ptr<Job> job, bool parked) {
  const int64_t next = next_seq_;
  next_seq_ = std::max(job->seq, next_seq_);  // Add numbers it this
  Status s = Add(std::move(job), parked);
  if (!s.ok()) {
    next_seq_ = next;
    return s;
  }
  --counters_.accepted;
  return s;
}

const Job* Scheduler::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

std::vector<std::string> Scheduler::PendingIds() const {
  std::vector<std::string> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) out.push_back(id);
  return out;
}

void Scheduler::Enqueue(Job* job, bool front) {
  auto& q = queues_[job->model][job->priority];
  if (front)
    q.push_front(job);
  else
    q.push_back(job);
  ++depth_[job->model];
  if (job->deadline_us > 0) deadlines_.emplace(std::make_pair(job->deadline_us, job->seq), job->id);
}

void Scheduler::Undeadline(const Job* job) {
  if (job->deadline_us > 0) deadlines_.erase({job->deadline_us, job->seq});
}

void Scheduler::Unqueue(Job* job) {
  Undeadline(job);
  auto& pq = queues_[job->model];
  auto q = pq.find(job->priority);
  if (q != pq.end()) {
    // Looked for from both ends at once and erased alone: jobs leave mostly at an end (expiry in
    // seq order at the front, a CANCEL of the newest jobs at the back), where a deque finds and
    // erases them in O(1); std::remove scanned the whole level for every job.
    auto& dq = q->second;
    for (auto lo = dq.begin(), hi = dq.end(); lo != hi;) {  // [lo, hi): not looked at yet
      if (*lo == job) {
        dq.erase(lo);
        break;
      }
      if (++lo == hi) break;
      if (*--hi == job) {
        dq.erase(hi);
        break;
      }
    }
    if (dq.empty()) pq.erase(q);
  }
  --depth_[job->model];
}

void Scheduler::Park(Job* job) {
  parked_.insert(job->id);
  ++depth_[job->model];
}

void Scheduler::Unpark(Job* job) {
  parked_.erase(job->id);
  --depth_[job->model];
}

void Scheduler::AddWorker(const std::string& routing_id, protocol::WorkerHello hello,
                          int64_t now_us, const std::string& key) {
  auto [it, inserted] = workers_.try_emplace(routing_id);
  WorkerState& w = it->second;
  w.routing_id = routing_id;
  w.key = key;
  std::set<std::string> touched;  // the models whose specs may change: old and new
  for (const auto& [name, mb] : w.max_batch) touched.insert(name);
  w.max_batch.clear();
  for (const auto& m : hello.models) {
    w.max_batch[m.name] = m.max_batch;
    known_models_.insert(m.name);
    touched.insert(m.name);
  }
  w.hello = std::move(hello);
  w.last_seen_us = now_us;
  w.leaving = false;  // a READY after a `bye` DONE: it is ready for work again
  if (inserted) lru_.push_front(routing_id);  // a new worker is served first
  RefreshSpecs(touched, &routing_id);
}

void Scheduler::RefreshSpecs(const std::set<std::string>& models, const std::string* first) {
  struct Seen {
    bool unchecked = false;
    std::vector<InputSpecs> specs;
  };
  std::unordered_map<std::string, Seen> seen;
  auto note = [&](const WorkerState& w, bool front) {
    for (const auto& m : w.hello.models) {
      if (models.count(m.name) == 0) continue;
      Seen& s = seen[m.name];
      if (!m.inputs) {
        s.unchecked = true;
        continue;
      }
      auto found = std::find(s.specs.begin(), s.specs.end(), *m.inputs);
      if (found == s.specs.end())
        s.specs.insert(front ? s.specs.begin() : s.specs.end(), *m.inputs);
      else if (front)
        std::rotate(s.specs.begin(), found, found + 1);
    }
  };
  const WorkerState* front = nullptr;
  if (first != nullptr) {
    auto it = workers_.find(*first);
    if (it != workers_.end()) front = &it->second;
  }
  for (const auto& [id, w] : workers_)
    if (&w != front) note(w, false);
  if (front != nullptr) note(*front, true);
  for (auto& [model, s] : seen) {  // models no worker serves now keep their specs
    if (s.unchecked) s.specs.clear();
    specs_[model] = std::move(s.specs);
  }
}

void Scheduler::MarkLeaving(const std::string& routing_id) {
  auto it = workers_.find(routing_id);
  if (it != workers_.end()) it->second.leaving = true;
}

void Scheduler::Touch(const std::string& routing_id, int64_t now_us) {
  auto it = workers_.find(routing_id);
  if (it != workers_.end()) it->second.last_seen_us = now_us;
}

size_t Scheduler::Claim(const std::string& routing_id, const std::vector<std::string>& ids,
                        std::vector<const Job*>* were_waiting) {
  auto w = workers_.find(routing_id);
  if (w == workers_.end()) return 0;
  WorkerState& me = w->second;
  size_t taken = 0;
  for (const auto& id : ids) {
    // An id it holds already is known here (a job of that id waiting now is a newer one). Past
    // its capacity a claim is not believed: a worker repeating READYs with new ids would grow
    // the set without end.
    if (me.in_flight.count(id) != 0 ||
        static_cast<int64_t>(me.in_flight.size()) >= me.hello.capacity)
      continue;
    me.in_flight.insert(id);
    auto it = jobs_.find(id);
    // (Not a job of a model it does not serve: it could not run it.)
    if (it == jobs_.end() || me.max_batch.count(it->second->model) == 0) continue;
    Job* job = it->second.get();
    if (job->phase == JobPhase::kDispatched) {
      // Sent to an older connection of this same worker (it reconnected before that one was
      // dropped): it moves here, so that dropping that one does not requeue it. A job another
      // worker runs stays there.
      auto other = workers_.find(job->worker);
      if (other == workers_.end() || other == w || other->second.hello.worker != me.hello.worker)
        continue;
      other->second.in_flight.erase(id);
    } else {
      if (job->phase == JobPhase::kQueued)
        Unqueue(job);
      else
        Unpark(job);
      ++counters_.dispatched;
      if (were_waiting != nullptr) were_waiting->push_back(job);
    }
    job->phase = JobPhase::kDispatched;
    job->worker = routing_id;
    ++taken;
  }
  return taken;
}

std::vector<Job*> Scheduler::RemoveWorker(const std::string& routing_id, bool spend_attempt) {
  std::vector<Job*> requeued;
  auto it = workers_.find(routing_id);
  if (it == workers_.end()) return requeued;
  // Requeue newest first so that, pushed to the front, the oldest ends up first.
  std::vector<Job*> held;
  for (const auto& id : it->second.in_flight) {
    auto j = jobs_.find(id);
    // Only a job this worker holds now: an id it still runs after its job was taken (Take) may
    // name a newer job of that id, on another worker.
    if (j != jobs_.end() && j->second->phase == JobPhase::kDispatched &&
        j->second->worker == routing_id)
      held.push_back(j->second.get());
  }
  std::sort(held.begin(), held.end(), [](Job* a, Job* b) { return a->seq > b->seq; });
  for (Job* job : held) {
    job->phase = JobPhase::kQueued;
    job->worker.clear();
    if (spend_attempt) ++job->attempt;
    Enqueue(job, /*front=*/true);
    requeued.push_back(job);
  }
  std::set<std::string> models;
  for (const auto& [name, mb] : it->second.max_batch) models.insert(name);
  workers_.erase(it);
  lru_.remove(routing_id);
  RefreshSpecs(models, nullptr);
  return requeued;
}

std::vector<std::string> Scheduler::SilentWorkers(int64_t now_us, int64_t heartbeat_us,
                                                  int64_t liveness) const {
  std::vector<std::string> out;
  for (const auto& [id, w] : workers_) {
    const int64_t interval_us = std::max(heartbeat_us, w.hello.heartbeat_ms * 1000);
    if (w.last_seen_us < now_us - liveness * interval_us) out.push_back(id);
  }
  return out;
}

std::vector<std::unique_ptr<Job>> Scheduler::Complete(const std::string& routing_id,
                                                      const std::vector<std::string>& ids,
                                                      std::vector<std::string>* not_held) {
  std::vector<std::unique_ptr<Job>> done;
  auto w = workers_.find(routing_id);
  for (const auto& id : ids) {
    // Whatever became of the job, this worker has stopped running it: its credit comes back
    // (also for a job taken on another's word, or one whose id now names a newer job).
    if (w != workers_.end()) w->second.in_flight.erase(id);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const Job& job = *it->second;
    if (job.phase == JobPhase::kDispatched && job.worker == routing_id) {
      done.push_back(Take(id));
    } else {
      not_held->push_back(id);
    }
  }
  counters_.finished += static_cast<int64_t>(done.size());
  return done;
}

std::unique_ptr<Job> Scheduler::Take(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return nullptr;
  std::unique_ptr<Job> job = std::move(it->second);
  jobs_.erase(it);
  pending_bytes_ -=
      static_cast<int64_t>(job->inputs_raw.size()) + job->stored_bytes + job->attached_bytes;
  if (job->phase == JobPhase::kQueued) Unqueue(job.get());
  if (job->phase == JobPhase::kParked) Unpark(job.get());
  // (A dispatched job's id stays in its worker's in_flight: see scheduler.h.)
  return job;
}

std::vector<std::unique_ptr<Job>> Scheduler::TakeParked() {
  std::vector<std::unique_ptr<Job>> out;
  const std::set<std::string> ids = std::move(parked_);
  parked_.clear();
  for (const auto& id : ids)
    if (auto job = Take(id)) out.push_back(std::move(job));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
  return out;
}

std::vector<std::unique_ptr<Job>> Scheduler::TakeQueued(const std::string& model) {
  std::vector<std::string> ids;
  if (auto q = queues_.find(model); q != queues_.end())
    for (const auto& [priority, level] : q->second)
      for (const Job* j : level) ids.push_back(j->id);
  std::vector<std::unique_ptr<Job>> out;
  for (const auto& id : ids) out.push_back(Take(id));
  return out;
}

std::vector<std::unique_ptr<Job>> Scheduler::TakeExpired(int64_t now_us) {
  std::vector<std::unique_ptr<Job>> out;
  while (!deadlines_.empty() && deadlines_.begin()->first.first < now_us) {
    const auto first = deadlines_.begin();
    const std::string id = first->second;
    auto it = jobs_.find(id);
    // A job leaves deadlines_ when it leaves the queue (Unqueue, NextChunk): this one is queued,
    // and Take removes its entry. (Were one left behind, it goes here.)
    if (it == jobs_.end() || it->second->phase != JobPhase::kQueued ||
        it->second->seq != first->first.second) {
      deadlines_.erase(first);
      continue;
    }
    out.push_back(Take(id));
  }
  return out;
}

Scheduler::PriorityQueue::iterator Scheduler::OldestLevel(PriorityQueue& pq) {
  auto best = pq.begin();
  for (auto it = pq.begin(); it != pq.end(); ++it) {
    if (it->second.front()->seq < best->second.front()->seq) best = it;
  }
  return best;
}

bool WorkerState::IsWarm(const std::string& model) const {
  if (!hello.resident) return true;
  for (const auto& m : *hello.resident) {
    if (m == model) return true;
  }
  return false;
}

bool Scheduler::WarmSomewhere(const std::string& model) const {
  for (const auto& [id, w] : workers_) {
    if (w.max_batch.count(model) && w.IsWarm(model)) return true;
  }
  return false;
}

Scheduler::PriorityQueue* Scheduler::BestQueueFor(const WorkerState& w, bool warm_only,
                                                  std::string* model) {
  PriorityQueue* best = nullptr;
  const Job* best_head = nullptr;
  for (const auto& [name, max_batch] : w.max_batch) {
    auto it = queues_.find(name);
    if (it == queues_.end() || it->second.empty()) continue;
    if (warm_only && !w.IsWarm(name) && WarmSomewhere(name)) continue;
    const Job* head = it->second.begin()->second.front();
    if (!best_head || head->priority > best_head->priority ||
        (head->priority == best_head->priority && head->seq < best_head->seq)) {
      best = &it->second;
      best_head = head;
      *model = name;
    }
  }
  return best;
}

bool Scheduler::NextChunk(Chunk* out) {
  out->jobs.clear();
  // Pass 1: warm placements only; pass 2: any worker with credit (a cold load).
  for (const bool warm_only : {true, false}) {
    for (auto lru_it = lru_.begin(); lru_it != lru_.end(); ++lru_it) {
      WorkerState& w = workers_.at(*lru_it);
      int64_t credit = w.credit();
      if (credit <= 0) continue;
      std::string model;
      PriorityQueue* pq = BestQueueFor(w, warm_only, &model);
      if (!pq) continue;
      int64_t take = std::min(credit, w.max_batch[model]);
      // Every aging_every-th chunk of a model serves the oldest jobs, whatever their priority.
      const bool aging = aging_every_ > 0 && ++chunks_by_model_[model] % aging_every_ == 0;
      while (take > 0 && !pq->empty()) {
        auto level = aging ? OldestLevel(*pq) : pq->begin();
        Job* job = level->second.front();
        level->second.pop_front();
        if (level->second.empty()) pq->erase(level);
        Undeadline(job);
        job->phase = JobPhase::kDispatched;
        job->worker = w.routing_id;
        w.in_flight.insert(job->id);
        out->jobs.push_back(job);
        --take;
      }
      depth_[model] -= out->jobs.size();
      out->worker = w.routing_id;
      lru_.splice(lru_.end(), lru_, lru_it);  // now the most recently served
      ++counters_.chunks;
      counters_.dispatched += static_cast<int64_t>(out->jobs.size());
      return true;
    }
  }
  return false;
}

int64_t Scheduler::OldestQueuedSubmittedUs(const std::string& model) const {
  // Each priority level is in seq order (a requeued job goes back to the front with its old
  // seq), so the oldest queued job is one of the levels' fronts.
  const Job* oldest = nullptr;
  if (auto it = queues_.find(model); it != queues_.end())
    for (const auto& [priority, level] : it->second)
      if (!level.empty() && (!oldest || level.front()->seq < oldest->seq)) oldest = level.front();
  // Parked jobs wait too (a few, for one liveness period after a restart).
  for (const auto& id : parked_) {
    const Job* job = jobs_.at(id).get();
    if (job->model == model && (!oldest || job->seq < oldest->seq)) oldest = job;
  }
  return oldest ? oldest->submitted_us : 0;
}

size_t Scheduler::ParkedOf(const std::string& model) const {
  size_t n = 0;  // (a few, for one liveness period after a restart)
  for (const auto& id : parked_) n += jobs_.at(id)->model == model ? 1 : 0;
  return n;
}

size_t Scheduler::QueueDepth(const std::string& model) const {
  auto it = depth_.find(model);
  return it == depth_.end() ? 0 : it->second;
}

std::map<std::string, size_t> Scheduler::QueueDepths() const {
  std::map<std::string, size_t> out;
  for (const auto& m : known_models_) out[m] = QueueDepth(m);
  return out;
}

}  // namespace ferry::broker
