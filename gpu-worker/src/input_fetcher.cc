#include "input_fetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>
#include <map>
#include <new>
#include <optional>
#include <thread>

#include "ferry/protocol/redis_errors.h"
#include "ferry/runtime/thread_name.h"
#include "ferry/tensor.h"

namespace ferry::worker {
namespace {

// What a job with fetched inputs keeps alive: the received CHUNK (its other inputs point into
// it) and the buffer its stored inputs were read into, shared by its model's jobs of one fetch.
struct FetchedInputs {
  std::shared_ptr<const void> chunk;
  std::shared_ptr<char[]> buffer;
};

// Where the values `order` names go in one buffer: input-major (every job's input 0, then every
// job's input 1, ...), each input's run starting at a multiple of 64 bytes from the buffer's
// start (which is aligned for any dtype) and each value at a multiple of its item size. So the
// inputs a batch stacks lie back to back, aligned, and a model on the CPU reads them where they
// are instead of a copy (model.cc, Stack). `sizes[n]`, `index[n]`, `item[n]`: value n's byte
// count, input index and item size; sets (*offsets)[n] for each n in `order`. Returns the
// buffer's size.
size_t Layout(std::vector<size_t> order, const std::vector<size_t>& sizes,
              const std::vector<int32_t>& index, const std::vector<size_t>& item,
              std::vector<size_t>* offsets) {
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return index[a] < index[b]; });
  size_t end = 0;
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t v = order[n];
    const size_t align = n == 0 || index[v] != index[order[n - 1]] ? 64 : item[v];
    end = (end + align - 1) / align * align;
    (*offsets)[v] = end;
    end += sizes[v];
  }
  return end;
}

// The bytes `job`'s stored inputs declare (at most 2^62: the codec checks a job's total).
uint64_t StoredBytes(const Job& job) {
  uint64_t bytes = 0;
  for (int32_t i : job.entry.stored_inputs)
    bytes += job.entry.inputs.at(static_cast<size_t>(i)).size;
  return bytes;
}

}  // namespace

InputFetcher::InputFetcher(Options options, JobQueue* queue, ResultWriter* writer)
    : options_(std::move(options)), keys_(options_.prefix), queue_(queue), writer_(writer) {}

InputFetcher::~InputFetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    aborted_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!waiting_.empty())
    spdlog::error("input fetcher: {} job(s) abandoned unfetched", waiting_.size());
}

bool InputFetcher::Backoff(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return aborted_; });
}

void InputFetcher::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void InputFetcher::Submit(std::vector<Job> jobs) {
  if (jobs.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& j : jobs) waiting_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void InputFetcher::Stop() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    // Redis down for good must not hold the process: past the timeout the retries end.
    if (!finished_cv_.wait_for(lock, std::chrono::milliseconds(options_.stop_timeout_ms),
                               [this] { return finished_; })) {
      spdlog::error("input fetcher: Redis still unreachable {} ms after Stop; giving up",
                    options_.stop_timeout_ms);
      aborted_ = true;
      cv_.notify_all();
    }
  }
  thread_.join();
}

size_t InputFetcher::Cancel(const std::vector<std::string>& ids) {
  std::vector<JobResult> dropped;
  size_t marked = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::unordered_set<std::string> wanted(ids.begin(), ids.end());
    auto kept = std::stable_partition(waiting_.begin(), waiting_.end(),
                                      [&](const Job& j) { return wanted.count(j.entry.id) == 0; });
    for (auto it = kept; it != waiting_.end(); ++it)
      dropped.push_back(CancelledResult(std::move(*it)));
    waiting_.erase(kept, waiting_.end());
    for (const std::string& id : wanted) {
      const auto copies = in_flight_ids_.find(id);
      if (copies != in_flight_ids_.end() && cancelled_.insert(id).second) marked += copies->second;
    }
  }
  const size_t n = dropped.size() + marked;
  if (!dropped.empty()) writer_->Submit(std::move(dropped));
  return n;
}

void InputFetcher::TakeCancelledLocked(std::vector<Job>* jobs, std::vector<JobResult>* cancelled) {
  if (cancelled_.empty()) return;
  auto kept = std::stable_partition(
      jobs->begin(), jobs->end(), [&](const Job& j) { return cancelled_.count(j.entry.id) == 0; });
  for (auto it = kept; it != jobs->end(); ++it)
    cancelled->push_back(CancelledResult(std::move(*it)));
  jobs->erase(kept, jobs->end());
}

void InputFetcher::SetInFlightLocked(const std::vector<Job>& jobs) {
  in_flight_ = jobs.size();
  in_flight_ids_.clear();
  for (const Job& j : jobs) ++in_flight_ids_[j.entry.id];
  // Marks of jobs no longer here (failed, cancelled, or passed on) go; a mark stays while a copy
  // of its id is here (the broker may have sent the job again: see the header).
  for (auto it = cancelled_.begin(); it != cancelled_.end();)
    it = in_flight_ids_.count(*it) != 0 ? std::next(it) : cancelled_.erase(it);
}

size_t InputFetcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size() + in_flight_;
}

size_t InputFetcher::reading() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void InputFetcher::Loop() {
  runtime::NameThisThread("ferry-fetch");
  while (true) {
    std::vector<Job> jobs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
      if (aborted_ || waiting_.empty()) break;  // stopping, nothing left
      // The jobs in order up to kMaxTurnBytes of declared inputs (the first one always), so
      // that the turn's buffers stay bounded; the rest wait for the next turn.
      size_t take = 0;
      for (uint64_t bytes = 0; take < waiting_.size(); ++take) {
        const uint64_t more = StoredBytes(waiting_[take]);
        if (take > 0 && bytes + more > kMaxTurnBytes) break;
        bytes += more;
      }
      jobs.assign(std::make_move_iterator(waiting_.begin()),
                  std::make_move_iterator(waiting_.begin() + static_cast<ptrdiff_t>(take)));
      waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<ptrdiff_t>(take));
      SetInFlightLocked(jobs);
    }
    int backoff_ms = options_.backoff_initial_ms;
    bool aborted = false;
    for (int attempt = 1;; ++attempt) {
      const Status s = FetchOrFail(&jobs);
      std::vector<JobResult> cancelled;  // while waiting for a retry
      {
        std::lock_guard<std::mutex> lock(mu_);
        TakeCancelledLocked(&jobs, &cancelled);
        SetInFlightLocked(jobs);
      }
      if (!cancelled.empty()) writer_->Submit(std::move(cancelled));
      if (jobs.empty()) break;
      if ((attempt & (attempt - 1)) == 0)
        spdlog::warn("input fetcher: {} job(s) wait for their stored inputs (attempt {}): {}",
                     jobs.size(), attempt, s.ToString());
      if (!Backoff(backoff_ms)) {
        aborted = true;
        break;
      }
      backoff_ms = std::min(backoff_ms * 2, options_.backoff_max_ms);
    }
    std::lock_guard<std::mutex> lock(mu_);
    SetInFlightLocked({});
    if (aborted) {
      spdlog::error("input fetcher: aborted with {} job(s) unfetched",
                    jobs.size() + waiting_.size());
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
  }
  finished_cv_.notify_all();
}

Status InputFetcher::FetchOrFail(std::vector<Job>* jobs) {
  std::string why;
  try {
    return FetchOnce(jobs);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an unknown exception";
  }
  // The connection may be out of step: the next turn reconnects.
  client_.reset();
  std::vector<JobResult> failed;
  for (Job& job : *jobs)
    failed.push_back(
        FailedResult(std::move(job), Status::Internal("reading the stored inputs failed: " + why)));
  jobs->clear();
  spdlog::error("input fetcher: {} job(s) failed: reading their stored inputs threw {}",
                failed.size(), why);
  writer_->Submit(std::move(failed));
  return Status::Ok();
}

Status InputFetcher::FetchOnce(std::vector<Job>* jobs) {
  if (!client_)
    FERRY_RETURN_IF_ERROR(
        protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_));
  std::vector<std::string> keys;
  std::vector<size_t> sizes;   // what each value must hold (its dtype and shape)
  std::vector<int32_t> index;  // its input index
  std::vector<size_t> item;    // its dtype's item size
  std::map<std::string, std::vector<size_t>> of_model;  // the values of each model's jobs
  for (const Job& job : *jobs) {
    for (int32_t i : job.entry.stored_inputs) {
      const protocol::TensorRef& t = job.entry.inputs.at(static_cast<size_t>(i));
      of_model[job.entry.model].push_back(keys.size());
      keys.push_back(keys_.Input(job.entry.id, i));
      sizes.push_back(t.size);
      index.push_back(i);
      item.push_back(ItemSize(t.dtype));
    }
  }
  // One buffer per model (so that a job waiting for its model to load holds only its own
  // model's), laid out by Layout; new char[]: not zero-filled (a std::string would be, at half
  // the cost of reading it). A buffer that cannot be allocated fails its model's jobs; their
  // values are skipped (where[n] stays null).
  std::map<std::string, std::shared_ptr<char[]>> buffer_of;  // model -> its buffer
  std::map<std::string, size_t> no_room;                     // model -> the bytes refused
  std::vector<size_t> offsets(keys.size());
  std::vector<char*> where(keys.size(), nullptr);  // value n's place
  for (const auto& [model, values] : of_model) {
    const size_t bytes = Layout(values, sizes, index, item, &offsets);
    std::shared_ptr<char[]> buffer;
    try {
      buffer.reset(new char[std::max<size_t>(bytes, 1)]);
    } catch (const std::bad_alloc&) {
      no_room[model] = bytes;
      continue;
    }
    for (size_t n : values) where[n] = buffer.get() + offsets[n];
    buffer_of[model] = std::move(buffer);
  }
  // A value of another size than its input needs is skipped on its way from the socket (null):
  // only its size is kept, to fail its job.
  std::vector<size_t> got(keys.size());
  auto into = [&](size_t n, size_t size) -> char* {
    got[n] = size;
    return size == sizes[n] ? where[n] : nullptr;
  };
  // Each value goes from the socket straight into its place: one copy, by the kernel.
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<bool> found;
  std::vector<std::string> errors;  // per key: Redis's error reply, "" if none
  FERRY_RETURN_IF_ERROR(client_->GetManyInto(views, into, &found, /*consume=*/false, &errors));

  std::vector<Job> ready, retry;
  std::vector<JobResult> failed;
  ready.reserve(jobs->size());
  failed.reserve(jobs->size());
  Status transient;  // the first error reply worth retrying
  size_t next = 0;
  for (Job& job : *jobs) {
    const size_t first = next;
    next += job.entry.stored_inputs.size();
    const auto room = no_room.find(job.entry.model);
    Status bad;
    bool again = false;
    for (size_t k = 0; k < job.entry.stored_inputs.size() && bad.ok(); ++k) {
      const size_t n = first + k;
      const int32_t i = job.entry.stored_inputs[k];
      const protocol::TensorRef& t = job.entry.inputs.at(static_cast<size_t>(i));
      const std::string input = "stored input " + std::to_string(i);
      if (!errors[n].empty()) {
        if (protocol::IsTransientRedisError(errors[n])) {
          again = true;
          if (transient.ok()) transient = Status::Unavailable("redis: " + errors[n]);
        } else {
          bad = Status::InvalidArgument(input + " (" + keys[n] + ") cannot be read: " + errors[n]);
        }
      } else if (!found[n]) {
        bad = Status::NotFound(input + " of job " + job.entry.id +
                               " is not in Redis (it expired, or an earlier attempt of the job "
                               "finished and removed it)");
      } else if (got[n] != t.size) {
        bad = Status::InvalidArgument(input + " has " + std::to_string(got[n]) +
                                      " bytes; its dtype and shape need " + std::to_string(t.size));
      } else if (room != no_room.end()) {
        bad = Status::Internal(input + " (" + std::to_string(t.size) +
                               " bytes) finds no memory: the " + std::to_string(room->second) +
                               " bytes of its model's stored inputs in this fetch could not be "
                               "allocated");
      }
    }
    if (!bad.ok()) {
      failed.push_back(FailedResult(std::move(job), bad));
    } else if (again) {
      retry.push_back(std::move(job));
    } else {
      for (size_t k = 0; k < job.entry.stored_inputs.size(); ++k) {
        const size_t i = static_cast<size_t>(job.entry.stored_inputs[k]);
        job.entry.inputs.at(i).data = where[first + k];
      }
      auto fetched = std::make_shared<FetchedInputs>();
      fetched->chunk = std::move(job.chunk);
      fetched->buffer = buffer_of[job.entry.model];
      job.chunk = std::move(fetched);
      ready.push_back(std::move(job));
    }
  }
  *jobs = std::move(retry);
  if (!failed.empty()) {
    spdlog::warn("input fetcher: {} job(s) failed (first: {}: {})", failed.size(),
                 failed.front().job.entry.id, failed.front().status.message());
    writer_->Submit(std::move(failed));
  }
  // Under Cancel's lock: a job it marked is dropped here; one it did not is in the queue before
  // it returns (JobQueue::Remove then finds it).
  std::vector<JobResult> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TakeCancelledLocked(&ready, &cancelled);
    if (!ready.empty()) queue_->Push(std::move(ready));
    SetInFlightLocked(*jobs);  // those left to retry
  }
  if (!cancelled.empty()) writer_->Submit(std::move(cancelled));
  return transient;
}

}  // namespace ferry::worker
