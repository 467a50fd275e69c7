#include "model_registry.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "ferry/protocol/util.h"
#include "warmup.h"

namespace ferry::worker {
namespace {

std::string Mib(int64_t bytes) {
  char text[32];
  if (bytes < 1024 * 1024)
    std::snprintf(text, sizeof(text), "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

}  // namespace

ModelRegistry::Lease& ModelRegistry::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    name_ = std::move(other.name_);
    model_ = std::move(other.model_);
    limit_ = other.limit_;
    other.registry_ = nullptr;
    other.limit_ = nullptr;
  }
  return *this;
}

void ModelRegistry::Lease::Reset() {
  if (registry_ != nullptr) registry_->Release(name_);
  registry_ = nullptr;
  model_.reset();
  limit_ = nullptr;
}

ModelRegistry::ModelRegistry(Options options, std::vector<ModelConfig> configs)
    : options_(options) {
  for (auto& c : configs) {
    order_.push_back(c.name);
    Entry& e = entries_[c.name];
    e.limit = std::make_unique<BatchLimit>(c.max_batch, options_.oom_hold_us, options_.oom_step_us);
    e.config = std::move(c);
  }
}

ModelRegistry::~ModelRegistry() = default;

void ModelRegistry::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(listener);
}

void ModelRegistry::Notify() {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_) listener_();
}

Status ModelRegistry::LoadEager() {
  for (const std::string& name : order_) {
    if (entries_.at(name).config.load != LoadPolicy::kEager) continue;
    Lease lease;
    FERRY_RETURN_IF_ERROR(Acquire(name, &lease));
  }
  return Status::Ok();
}

int64_t ModelRegistry::Estimate(const Entry& e) const {
  if (e.measured > 0) return e.measured;
  std::error_code ec;
  const auto size = std::filesystem::file_size(e.config.path, ec);
  if (ec) return 0;
  return static_cast<int64_t>(size) / (e.config.half ? 2 : 1);
}

ModelRegistry::Room ModelRegistry::MakeRoom(const std::string& for_model, int64_t need,
                                            std::vector<std::shared_ptr<const Model>>* dropped) {
  const int64_t budget = options_.memory_budget;
  if (budget <= 0 || used_ + need <= budget) return Room::kFits;
  // Bytes no eviction can ever free: pinned models, resident or loading. (A model loading that
  // is not pinned is idle once loaded: evictable then, like one with a batch running; waited
  // for below, kWait, not counted here.)
  int64_t fixed = 0;
  for (const auto& [name, e] : entries_) {
    if (name == for_model) continue;
    if (e.config.pinned && (e.state == State::kLoading || e.state == State::kResident))
      fixed += e.bytes;
  }
  if (fixed + need > budget) return Room::kNever;
  while (used_ + need > budget) {
    Entry* victim = nullptr;
    for (auto& [name, e] : entries_) {
      if (name == for_model || e.state != State::kResident || e.config.pinned || e.in_use > 0)
        continue;
      if (victim == nullptr || e.last_used < victim->last_used) victim = &e;
    }
    if (victim == nullptr) return Room::kWait;
    spdlog::info("model {}: unloaded ({}) to make room for {} under the {} budget",
                 victim->config.name, Mib(victim->bytes), for_model, Mib(budget));
    // No batch runs (in_use == 0): what the model showed of itself is final.
    victim->writes_inputs = victim->writes_inputs || victim->model->writes_into_inputs();
    dropped->push_back(std::move(victim->model));
    used_ -= victim->bytes;
    victim->bytes = 0;
    victim->state = State::kUnloaded;
    ++evictions_;
  }
  return Room::kFits;
}

Status ModelRegistry::Acquire(const std::string& name, Lease* out, const cuda::Stream* stream) {
  out->Reset();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end())
    return Status(codes::kUnknownModel, "this worker does not serve model \"" + name + "\"");
  Entry& e = it->second;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.wait_for_room_ms);
  std::vector<std::shared_ptr<const Model>> dropped;
  bool held = false;
  while (e.state != State::kResident) {
    if (e.state == State::kLoading) {  // another executor loads it: wait for that
      cv_.wait(lock);
      continue;
    }
    if (e.failed_at_us != 0) {
      const int64_t since_us = protocol::MonotonicMicros() - e.failed_at_us;
      if (since_us < options_.load_retry_us)
        return Status(e.failure.code(),
                      e.failure.message() + " (its load failed " + std::to_string(since_us / 1000) +
                          " ms ago; tried again " + std::to_string(options_.load_retry_us / 1000) +
                          " ms after that)");
    }
    const int64_t need = Estimate(e);
    const Room room = MakeRoom(name, need, &dropped);
    if (!dropped.empty()) {  // unload outside the lock, tell the listener, look again
      lock.unlock();
      dropped.clear();
      Notify();
      lock.lock();
      continue;
    }
    if (room == Room::kNever) {
      return Status(codes::kTooLarge, "model \"" + name + "\" (about " + Mib(need) +
                                          ") does not fit in the memory budget of " +
                                          Mib(options_.memory_budget) + " next to pinned models");
    }
    if (room == Room::kWait) {
      spdlog::debug("model {}: waiting for a busy model to finish before loading", name);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout)
        return Status(codes::kUnavailable, "model \"" + name +
                                               "\" could not be loaded: the memory budget is held "
                                               "by models with batches running");
      continue;
    }
    FERRY_RETURN_IF_ERROR(Load(&e, stream, &lock));
    held = true;  // Load held it for us
  }
  if (!held) ++e.in_use;
  e.last_used = ++clock_;
  out->registry_ = this;
  out->name_ = name;
  out->model_ = e.model;
  out->limit_ = e.limit.get();
  return Status::Ok();
}

Status ModelRegistry::Load(Entry* e, const cuda::Stream* stream,
                           std::unique_lock<std::mutex>* lock) {
  const int64_t reserved = Estimate(*e);
  const bool writes_inputs = e->writes_inputs;
  e->state = State::kLoading;
  e->bytes = reserved;
  used_ += reserved;
  lock->unlock();

  const int64_t start = protocol::MonotonicMicros();
  std::unique_ptr<Model> model;
  Status s;
  int64_t warm_batches = 0;
  {
    std::lock_guard<std::mutex> one_load(load_mu_);
    // Nothing may escape between kLoading and the state below: waiters (Acquire) would wait
    // for this load for ever, and the executor that called it would hang.
    try {
      s = Model::Create(e->config, &model, writes_inputs);
      if (s.ok()) s = WarmUp(*model, e->config.max_batch, stream, &warm_batches);
    } catch (const std::exception& ex) {
      s = Status::Internal(std::string("loading threw: ") + ex.what());
    }
  }
  if (!s.ok()) model.reset();  // free the memory before anyone else counts on it

  lock->lock();
  used_ -= reserved;
  if (!s.ok()) {
    e->state = State::kUnloaded;
    e->bytes = 0;
    // A failure that may pass by itself (device memory others held, a device not up yet) is
    // tried again at the next batch; one of the file or the config waits load_retry_us.
    const bool lasting =
        s.code() != codes::kUnavailable && s.message().find("out of memory") == std::string::npos;
    e->failed_at_us = lasting ? protocol::MonotonicMicros() : 0;
    e->failure = s;
    cv_.notify_all();
    spdlog::error("model {}: load failed: {}", e->config.name, s.ToString());
    return s;
  }
  e->failed_at_us = 0;
  e->model = std::shared_ptr<const Model>(std::move(model));
  e->measured = e->bytes = e->model->memory_bytes();
  used_ += e->bytes;
  e->state = State::kResident;
  ++loads_;
  spdlog::info(
      "model {} resident on {}: {} ({} in parameters), {} warmup batch(es), {} ms; "
      "{} of {} in use",
      e->config.name, e->config.device, Mib(e->bytes), Mib(e->model->parameter_bytes()),
      warm_batches, (protocol::MonotonicMicros() - start) / 1000, Mib(used_),
      options_.memory_budget > 0 ? Mib(options_.memory_budget) : "no budget");
  // The estimate may have been low: make the budget true again if idle models allow it.
  std::vector<std::shared_ptr<const Model>> dropped;
  MakeRoom(e->config.name, 0, &dropped);
  if (options_.memory_budget > 0 && used_ > options_.memory_budget)
    spdlog::warn("models use {}, over the {} budget (the rest is pinned or busy)", Mib(used_),
                 Mib(options_.memory_budget));
  // Held for the caller before the lock goes: a load waiting for room would otherwise evict it
  // while the listener runs.
  ++e->in_use;
  cv_.notify_all();
  lock->unlock();
  dropped.clear();
  Notify();
  lock->lock();
  return Status::Ok();
}

void ModelRegistry::Release(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it != entries_.end() && it->second.in_use > 0) --it->second.in_use;
  }
  cv_.notify_all();
}

size_t ModelRegistry::MaxBatch(const std::string& name, size_t fallback) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return fallback;
  return static_cast<size_t>(it->second.limit->Current(protocol::MonotonicMicros()));
}

std::vector<std::string> ModelRegistry::Names() const { return order_; }

std::vector<std::string> ModelRegistry::Resident() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& name : order_)
    if (entries_.at(name).state == State::kResident) out.push_back(name);
  return out;
}

bool ModelRegistry::IsResident(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.state == State::kResident;
}

const ModelConfig* ModelRegistry::Config(const std::string& name) const {
  auto it = entries_.find(name);  // configs never change after construction
  return it == entries_.end() ? nullptr : &it->second.config;
}

int64_t ModelRegistry::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t ModelRegistry::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

int64_t ModelRegistry::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

}  // namespace ferry::worker
