#include "ferry/protocol/util.h"

#include <algorithm>

#include <unistd.h>

#include <chrono>
#include <random>

namespace ferry::protocol {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t MonotonicMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string NewUuid() {
  // Seeded per thread, and again in a child after fork(): a child inherits its parent's state,
  // and the two (or every worker of a pre-fork server) would make the same ids.
  thread_local std::mt19937_64 rng;
  thread_local pid_t seeded_in = 0;
  if (const pid_t pid = getpid(); pid != seeded_in) {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(pid)};
    rng.seed(seq);
    seeded_in = pid;
  }
  uint64_t hi = rng(), lo = rng();
  hi = (hi & 0xFFFFFFFFFFFF0FFFULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 10
  // 8-4-4-4-12 lowercase hex digits of hi, lo. Written by hand: snprintf took ~2,600
  // instructions per id, 7 % of the SDK's work per Client::Run (docs/performance.md, callgrind).
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(36, '-');
  size_t pos = 0;
  auto put = [&](uint64_t v, int digits) {  // the low `digits` hex digits of v, then skip a '-'
    for (int i = digits - 1; i >= 0; --i) id[pos++] = kHex[(v >> (4 * i)) & 0xF];
    ++pos;
  };
  put(hi >> 32, 8);
  put(hi >> 16, 4);
  put(hi, 4);
  put(lo >> 48, 4);
  put(lo, 12);
  return id;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max) + 3);
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out.push_back(c < 0x20 || c >= 0x7f ? '?' : static_cast<char>(c));
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace ferry::protocol
