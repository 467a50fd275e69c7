#pragma once
// ModelRegistry: the models a worker serves, which of them are resident (loaded and warm), and
// the memory budget they share.
//
// Every model is loaded either eagerly (LoadEager, before the worker announces itself) or
// lazily, by the first batch that needs it (Acquire). A load measures the model's memory
// (Model::memory_bytes) and runs its warmup; only then does the model count as resident.
// When a load would take the resident models past `memory_budget` bytes, the least recently
// used resident model that is neither pinned nor in use is unloaded first, then the next, until
// the new one fits; when only busy models stand in the way, the load waits for a lease to be
// released (at most `wait_for_room_ms`, then the batch fails with `unavailable`). A model with
// a batch running (a live Lease) is never unloaded; a pinned model never. A model that cannot
// fit even with every unpinned model gone fails its jobs with `too_large`. The size of a model
// that never loaded is estimated from its file (halved for half precision) and corrected once
// measured. A model seen writing into its inputs (Model::writes_into_inputs) is remembered as
// such when it is unloaded: loaded again, it gets copies from its first batch on. A lazy load
// that failed for good (a broken file, a failing warmup; not out of memory) is not tried again
// for `load_retry_us` (its batches fail with its error meanwhile): a broken model file would
// otherwise unload the healthy models to make room at every batch.
//
// Every change of the resident set calls the listener (outside the registry's lock), so the
// worker can re-announce itself and the broker can prefer workers that have a model warm.
//
// Thread-safety: every method may be called from any thread. Loads are serialised (so that
// the allocator's growth measures one model); a batch of a resident model never waits on them.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "batch_limit.h"
#include "cuda_support.h"
#include "ferry/status.h"
#include "ferry/worker/model_config.h"
#include "model.h"

namespace ferry::worker {

class ModelRegistry {
 public:
  struct Options {
    int64_t memory_budget = 0;         // bytes; 0 = unlimited
    int64_t wait_for_room_ms = 60000;  // how long a load waits for busy models to finish
    int64_t oom_hold_us = BatchLimit::kDefaultHoldUs;
    int64_t oom_step_us = BatchLimit::kDefaultStepUs;
    // After a lazy load failed (not for lack of device memory, nor `unavailable`), the model's
    // batches fail with that error, without a load or an unload, for this long; the next one
    // after it tries again.
    int64_t load_retry_us = 10 * 1000 * 1000;
  };

  // A model held for one batch: while it lives the model is not unloaded. Move-only.
  class Lease {
   public:
    Lease() = default;
    ~Lease() { Reset(); }
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    const Model& model() const { return *model_; }
    BatchLimit* limit() const { return limit_; }
    explicit operator bool() const { return model_ != nullptr; }
    void Reset();

   private:
    friend class ModelRegistry;
    ModelRegistry* registry_ = nullptr;
    std::string name_;
    std::shared_ptr<const Model> model_;
    BatchLimit* limit_ = nullptr;
  };

  // `configs` must be complete (device and max_batch resolved) and have unique names.
  ModelRegistry(Options options, std::vector<ModelConfig> configs);
  ~ModelRegistry();  // every Lease must be gone
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // Loads (and warms) every eager model, in order. Fails with the first failure.
  Status LoadEager();
  // Holds `name` for a batch, loading it first when it is not resident (on `stream`, which the
  // warmup uses). kUnknownModel for a name this registry does not have.
  Status Acquire(const std::string& name, Lease* out, const cuda::Stream* stream = nullptr);

  // Called (outside the lock) whenever the resident set changes.
  void SetListener(std::function<void()> listener);

  // The most jobs a batch of `name` may hold now (lowered after out-of-memory errors);
  // `fallback` for an unknown name.
  size_t MaxBatch(const std::string& name, size_t fallback) const;
  std::vector<std::string> Names() const;     // every model, in configuration order
  std::vector<std::string> Resident() const;  // loaded and warm, in configuration order
  bool IsResident(const std::string& name) const;
  const ModelConfig* Config(const std::string& name) const;  // null when unknown
  int64_t used_bytes() const;
  int64_t loads() const;
  int64_t evictions() const;

 private:
  enum class State { kUnloaded, kLoading, kResident };
  struct Entry {
    ModelConfig config;
    State state = State::kUnloaded;
    std::shared_ptr<const Model> model;  // set while resident
    int in_use = 0;                      // live leases
    uint64_t last_used = 0;              // LRU clock
    int64_t bytes = 0;                   // measured, or the estimate while loading
    int64_t measured = 0;                // from the last load; 0: never loaded
    bool writes_inputs = false;          // an earlier load wrote into its inputs
    std::unique_ptr<BatchLimit> limit;   // survives unloads
    int64_t failed_at_us = 0;            // monotonic time of the last failed load; 0: none
    Status failure;                      // its error
  };
  enum class Room { kFits, kWait, kNever };

  void Release(const std::string& name);
  // Under mu_: unloads idle LRU models until `need` more bytes fit; the unloaded models go to
  // `dropped` (destroyed by the caller outside the lock).
  Room MakeRoom(const std::string& for_model, int64_t need,
                std::vector<std::shared_ptr<const Model>>* dropped);
  int64_t Estimate(const Entry& e) const;
  // Loads `e` (the lock released meanwhile) and, once it is resident, holds it for the caller
  // (in_use + 1) before the lock is released again for the listener.
  Status Load(Entry* e, const cuda::Stream* stream, std::unique_lock<std::mutex>* lock);
  void Notify();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a load finished or a lease was released
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  int64_t used_ = 0;  // bytes of resident and loading models
  uint64_t clock_ = 0;
  int64_t loads_ = 0;
  int64_t evictions_ = 0;
  std::mutex load_mu_;  // one load at a time
  std::mutex listener_mu_;
  std::function<void()> listener_;
};

}  // namespace ferry::worker
