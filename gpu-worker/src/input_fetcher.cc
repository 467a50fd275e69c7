#include "input_fetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "ferry/runtime/thread_name.h"

namespace ferry::worker {
namespace {

// What a job with fetched inputs keeps alive: the received CHUNK (its other inputs point into
// it) and the bytes read from Redis.
struct FetchedInputs {
  std::shared_ptr<const void> chunk;
  std::vector<std::string> bytes;
};

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
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t InputFetcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size() + in_flight_;
}

void InputFetcher::Loop() {
  runtime::NameThisThread("ferry-fetch");
  while (true) {
    std::vector<Job> jobs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
      if (aborted_ || waiting_.empty()) break;  // stopping, nothing left
      jobs.swap(waiting_);
      in_flight_ = jobs.size();
    }
    int backoff_ms = options_.backoff_initial_ms;
    bool aborted = false;
    for (int attempt = 1; !FetchOnce(&jobs); ++attempt) {
      if ((attempt & (attempt - 1)) == 0)
        spdlog::warn("input fetcher: {} job(s) wait for their stored inputs (attempt {})",
                     jobs.size(), attempt);
      if (!Backoff(backoff_ms)) {
        aborted = true;
        break;
      }
      backoff_ms = std::min(backoff_ms * 2, options_.backoff_max_ms);
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = 0;
    if (aborted) {
      spdlog::error("input fetcher: aborted with {} job(s) unfetched", jobs.size());
      break;
    }
  }
}

bool InputFetcher::FetchOnce(std::vector<Job>* jobs) {
  if (!client_) {
    Status s = protocol::RedisClient::Connect(options_.redis, options_.redis_timeout_ms, &client_);
    if (!s.ok()) return false;
  }
  std::vector<std::string> keys;
  for (const Job& job : *jobs) {
    for (int32_t i : job.entry.stored_inputs) keys.push_back(keys_.Input(job.entry.id, i));
  }
  // Each value is read from the socket straight into its string: one copy, by the kernel.
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::optional<std::string>> values;
  Status s = client_->GetMany(views, &values);
  if (!s.ok()) {
    spdlog::warn("input fetcher: reading {} stored input(s): {}", keys.size(), s.ToString());
    return false;
  }
  std::vector<Job> ready;
  std::vector<JobResult> failed;
  size_t next = 0;
  for (Job& job : *jobs) {
    auto fetched = std::make_shared<FetchedInputs>();
    fetched->chunk = job.chunk;
    Status bad;
    for (int32_t i : job.entry.stored_inputs) {
      std::optional<std::string>& value = values[next++];
      const protocol::TensorRef& t = job.entry.inputs.at(static_cast<size_t>(i));
      if (!bad.ok()) continue;
      if (!value) {
        bad = Status::NotFound("stored input " + std::to_string(i) + " of job " + job.entry.id +
                               " is not in Redis (it expired, or an earlier attempt of the job "
                               "finished and removed it)");
      } else if (value->size() != t.size) {
        bad = Status::InvalidArgument("stored input " + std::to_string(i) + " has " +
                                      std::to_string(value->size()) +
                                      " bytes; its dtype and shape need " + std::to_string(t.size));
      } else {
        fetched->bytes.push_back(std::move(*value));
      }
    }
    if (!bad.ok()) {
      failed.push_back(FailedResult(std::move(job), bad));
      continue;
    }
    // The strings no longer move: point the inputs at them.
    size_t k = 0;
    for (int32_t i : job.entry.stored_inputs) {
      protocol::TensorRef& t = job.entry.inputs[static_cast<size_t>(i)];
      t.data = fetched->bytes[k++].data();
    }
    job.chunk = std::move(fetched);
    ready.push_back(std::move(job));
  }
  jobs->clear();
  if (!failed.empty()) {
    spdlog::warn("input fetcher: {} job(s) failed (first: {}: {})", failed.size(),
                 failed.front().job.entry.id, failed.front().status.message());
    writer_->Submit(std::move(failed));
  }
  if (!ready.empty()) queue_->Push(std::move(ready));
  return true;
}

}  // namespace ferry::worker
