#pragma once
// FinishNotices: lets Wait() sleep until the broker says a job's result is readable.
//
// A waiter registers an id BEFORE its first Redis read, remembers the id's notice generation,
// reads Redis, and if there is no result yet sleeps until the generation moves (a FINISHED for
// that id arrived) or its re-check time comes. Reading the generation before the read means a
// notice that arrives between the read and the sleep is not missed. Several threads may wait on
// the same id; notices for ids nobody waits on are dropped, so state stays bounded by the number
// of waiting threads.
//
// Thread-safety: all methods are safe to call concurrently.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ferry::client {

class FinishNotices {
 public:
  class Registration;

  // Registers interest in `id` until the returned object is destroyed.
  std::unique_ptr<Registration> Register(const std::string& id);
  // Called by the I/O thread for each FINISHED message. Never blocks for long.
  void Notify(const std::vector<std::string>& ids);
  // Number of ids with waiters (for tests).
  size_t WaitingIds() const;

  class Registration {
   public:
    ~Registration();
    // The current generation; pass it to SleepUntil after reading Redis.
    uint64_t Generation() const;
    // Sleeps until a notice newer than `seen` arrives (returns true) or `until` (false).
    bool SleepUntil(uint64_t seen, std::chrono::steady_clock::time_point until);

   private:
    friend class FinishNotices;
    struct Entry;
    Registration(FinishNotices* owner, std::string id, std::shared_ptr<Entry> entry)
        : owner_(owner), id_(std::move(id)), entry_(std::move(entry)) {}
    FinishNotices* owner_;
    std::string id_;
    std::shared_ptr<Entry> entry_;
  };

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Registration::Entry>> entries_;  // by id
};

}  // namespace ferry::client
