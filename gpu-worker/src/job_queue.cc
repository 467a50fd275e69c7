#include "job_queue.h"

#include <unordered_set>

namespace ferry::worker {

bool JobQueue::Push(std::vector<Job> jobs) {
  size_t size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& j : jobs) jobs_.push_back(std::move(j));
    size = jobs_.size();
  }
  cv_.notify_all();
  return size <= capacity_;
}

bool JobQueue::TakeBatch(size_t max_batch, std::vector<Job>* out) {
  return TakeBatch([max_batch](const std::string&) { return max_batch; }, out);
}

bool JobQueue::TakeBatch(const std::function<size_t(const std::string& model)>& limit,
                         std::vector<Job>* out) {
  out->clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return closed_ || !jobs_.empty(); });
  if (jobs_.empty()) return false;  // closed and drained
  const std::string model = jobs_.front().entry.model;
  size_t max_batch = limit(model);
  if (max_batch == 0) max_batch = 1;
  for (auto it = jobs_.begin(); it != jobs_.end() && out->size() < max_batch;) {
    if (it->entry.model == model) {
      out->push_back(std::move(*it));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return true;
}

std::vector<Job> JobQueue::Remove(const std::vector<std::string>& ids) {
  std::vector<Job> removed;
  if (ids.empty()) return removed;
  const std::unordered_set<std::string> wanted(ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (wanted.count(it->entry.id)) {
      removed.push_back(std::move(*it));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

void JobQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

size_t JobQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

}  // namespace ferry::worker
