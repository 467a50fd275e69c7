#pragma once
// ReplyBacklog: the bytes of replies the broker has queued in ZeroMQ for each producer
// connection and ZeroMQ has not yet written out. ZeroMQ bounds a connection's queue by messages
// (10,000 replies), not bytes, and a reply can be big: a FINISHED may carry up to 8 MiB of inline
// records, an ACCEPTED echoes its SUBMIT's ids (10,000 of up to 256 characters in a rejection).
// A producer that stops reading its socket would pin gigabytes in the broker. So:
//   - once a connection's queued bytes would pass the inline limit (--max-inline-backlog-bytes),
//     its notices carry ids only (Fits) -- the producer then reads those results from Redis, as
//     it does for any id without an inline record;
//   - past that limit plus kOtherRepliesBytes, no reply goes to it at all (Admits): each is
//     dropped and counted, as one over ZeroMQ's message limit is;
// until ZeroMQ has written the queued ones out.
//
// A reply's bytes count from Track until ZeroMQ frees the message (written to the socket, or
// dropped). Thread-safety: Fits, Admits and Track on the broker thread; the counts go down on
// ZeroMQ's I/O thread (an atomic per connection, shared with its queued messages).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <zmq.hpp>

namespace ferry::broker {

class ReplyBacklog {
 public:
  // Room for replies other than inline records, above the inline limit.
  static constexpr int64_t kOtherRepliesBytes = int64_t{64} << 20;

  explicit ReplyBacklog(int64_t inline_limit_bytes)
      : inline_limit_(inline_limit_bytes), reply_limit_(inline_limit_bytes + kOtherRepliesBytes) {}

  // Whether `bytes` more of inline results may be queued for `producer` now.
  bool Fits(std::string_view producer, int64_t bytes) const;
  // Whether a reply of `bytes` may be queued for `producer` now (else it is dropped).
  bool Admits(std::string_view producer, int64_t bytes) const;
  // `body`, a reply for `producer`, made to count its `bytes` until ZeroMQ frees it. A body of
  // no bytes to count is returned as it is.
  zmq::message_t Track(std::string_view producer, zmq::message_t body, int64_t bytes);
  // Bytes queued for `producer` now (tests, metrics).
  int64_t queued(std::string_view producer) const;
  // Connections tracked: those with bytes queued, and idle ones not yet forgotten (tests).
  size_t connections() const { return counts_.size(); }

 private:
  using Count = std::shared_ptr<std::atomic<int64_t>>;
  const int64_t inline_limit_, reply_limit_;
  std::unordered_map<std::string, Count> counts_;  // producer routing id -> queued bytes
  size_t prune_at_ = 64;  // counts_ size at which connections with nothing queued are dropped
};

}  // namespace ferry::broker
