#pragma once
// OrphanWatch: models that no connected worker serves. A SUBMIT for such a model is still
// accepted (a worker may come back: a restart, a rolling update), but the broker says so -- one
// log line when a model loses its last worker and one when it has a worker again, and the
// ferry_model_workers{model} gauge -- and once a model has had no worker for
// --orphan-timeout-s, its queued jobs fail `unavailable` ("no worker for model M since T"), as
// do jobs queued for it later while it still has none. 0 turns the timeout off (jobs wait).
//
// Owned by the broker thread; not thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "scheduler.h"

namespace ferry::broker {

class OrphanWatch {
 public:
  // `timeout_s`: --orphan-timeout-s (0: never fail jobs). `start_us`: wall clock of the broker's
  // start, the "since" of models restored from the journal that no worker has served yet. No
  // look before heartbeat_ms * liveness after the start: the workers of a restarted broker
  // reconnect within it, and a restart should not log every model as orphaned.
  OrphanWatch(int64_t timeout_s, int64_t start_us, int64_t heartbeat_ms, int64_t liveness)
      : timeout_us_(timeout_s * 1000000),
        start_us_(start_us),
        next_check_us_(start_us + heartbeat_ms * liveness * 1000) {}

  struct Expired {
    std::string model;
    std::string message;  // "no worker for model M since 2026-11-25T13:40:00Z ..."
  };
  // Looks at the scheduler at most once a second (`now_us`: wall clock). Logs the models that
  // lost their last worker or got one back; returns those whose queued jobs must fail now.
  std::vector<Expired> Check(const Scheduler& scheduler, int64_t now_us);

  // Models with no worker now, and since when (wall clock, microseconds).
  const std::map<std::string, int64_t>& orphaned() const { return orphaned_; }

 private:
  const int64_t timeout_us_;
  const int64_t start_us_;
  int64_t next_check_us_;
  bool first_ = true;
  std::map<std::string, int64_t> orphaned_;  // model -> since
};

// "2026-11-25T13:40:00Z" for a wall-clock time in microseconds.
std::string FormatUtc(int64_t wall_us);

}  // namespace ferry::broker
