#pragma once
// InlineBacklog: the bytes of inline results (FINISHED "results") the broker has queued in
// ZeroMQ for each producer connection and ZeroMQ has not yet written out. ZeroMQ bounds a
// connection's queue by messages (10,000 replies), not bytes, and a FINISHED may carry up to
// 8 MiB of records: a producer that stops reading its socket would pin gigabytes in the broker.
// So once a connection's backlog would pass the limit (--max-inline-backlog-bytes), its
// notices carry ids only -- the producer then reads those results from Redis, as it does for
// any id without an inline record -- until ZeroMQ has written the queued ones out.
//
// A notice's bytes count from Track until ZeroMQ frees the message (written to the socket, or
// dropped). Thread-safety: Fits and Track on the broker thread; the counts go down on
// ZeroMQ's I/O thread (an atomic per connection, shared with its queued messages).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <zmq.hpp>

namespace ferry::broker {

class InlineBacklog {
 public:
  explicit InlineBacklog(int64_t limit_bytes) : limit_(limit_bytes) {}

  // Whether `bytes` more of inline results may be queued for `producer` now.
  bool Fits(std::string_view producer, int64_t bytes) const;
  // `body`, a FINISHED for `producer` carrying `inline_bytes` of records, made to count those
  // bytes until ZeroMQ frees it. A body without records is returned as it is.
  zmq::message_t Track(std::string_view producer, zmq::message_t body, int64_t inline_bytes);
  // Bytes queued for `producer` now (tests, metrics).
  int64_t queued(std::string_view producer) const;
  // Connections tracked: those with bytes queued, and idle ones not yet forgotten (tests).
  size_t connections() const { return counts_.size(); }

 private:
  using Count = std::shared_ptr<std::atomic<int64_t>>;
  const int64_t limit_;
  std::unordered_map<std::string, Count> counts_;  // producer routing id -> queued bytes
  size_t prune_at_ = 64;  // counts_ size at which connections with nothing queued are dropped
};

}  // namespace ferry::broker
