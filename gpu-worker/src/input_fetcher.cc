#include "input_fetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

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
  // the cost of reading it).
  std::map<std::string, std::shared_ptr<char[]>> buffer_of;  // model -> its buffer
  std::vector<size_t> offsets(keys.size());
  std::vector<char*> where(keys.size());  // value n's place
  for (const auto& [model, values] : of_model) {
    const size_t bytes = Layout(values, sizes, index, item, &offsets);
    std::shared_ptr<char[]> buffer(new char[std::max<size_t>(bytes, 1)]);
    for (size_t n : values) where[n] = buffer.get() + offsets[n];
    buffer_of[model] = std::move(buffer);
  }
  // A value of another size than its input needs is read aside, to fail its job.
  std::vector<size_t> got(keys.size());
  std::string aside;
  auto into = [&](size_t n, size_t size) -> char* {
    got[n] = size;
    if (size == sizes[n]) return where[n];
    aside.resize(size);
    return aside.data();
  };
  // Each value goes from the socket straight into its place: one copy, by the kernel.
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<bool> found;
  Status s = client_->GetManyInto(views, into, &found);
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
    fetched->buffer = buffer_of[job.entry.model];
    Status bad;
    for (int32_t i : job.entry.stored_inputs) {
      const size_t n = next++;
      protocol::TensorRef& t = job.entry.inputs.at(static_cast<size_t>(i));
      if (!bad.ok()) continue;
      if (!found[n]) {
        bad = Status::NotFound("stored input " + std::to_string(i) + " of job " + job.entry.id +
                               " is not in Redis (it expired, or an earlier attempt of the job "
                               "finished and removed it)");
      } else if (got[n] != t.size) {
        bad = Status::InvalidArgument("stored input " + std::to_string(i) + " has " +
                                      std::to_string(got[n]) + " bytes; its dtype and shape need " +
                                      std::to_string(t.size));
      } else {
        t.data = where[n];
      }
    }
    if (!bad.ok()) {
      failed.push_back(FailedResult(std::move(job), bad));
      continue;
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
