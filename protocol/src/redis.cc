#include "ferry/protocol/redis.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>

namespace ferry::protocol {
namespace {

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

timeval ToTimeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

// A connected hiredis context whose reads and writes time out after timeout_ms, for RedisClient
// and RedisSubscriber; kUnavailable (with host:port and why) when Redis cannot be reached.
Status ConnectContext(const RedisEndpoint& endpoint, int timeout_ms, redisContext** out) {
  *out = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, ToTimeval(timeout_ms));
  if (!*out || (*out)->err) {
    std::string why = *out ? (*out)->errstr : "out of memory";
    if (*out) redisFree(*out);
    *out = nullptr;
    return Status::Unavailable("redis " + endpoint.host + ":" + std::to_string(endpoint.port) +
                               ": " + why);
  }
  redisSetTimeout(*out, ToTimeval(timeout_ms));
  return Status::Ok();
}

}  // namespace

RedisClient::RedisClient(const RedisEndpoint& endpoint, int timeout_ms)
    : endpoint_(endpoint), timeout_ms_(timeout_ms) {}

RedisClient::~RedisClient() { Drop(); }

Status RedisClient::Connect(const RedisEndpoint& endpoint, int timeout_ms,
                            std::unique_ptr<RedisClient>* out) {
  std::unique_ptr<RedisClient> c(new RedisClient(endpoint, timeout_ms));
  FERRY_RETURN_IF_ERROR(c->EnsureConnected());
  *out = std::move(c);
  return Status::Ok();
}

std::unique_ptr<RedisClient> RedisClient::Lazy(const RedisEndpoint& endpoint, int timeout_ms) {
  return std::unique_ptr<RedisClient>(new RedisClient(endpoint, timeout_ms));
}

void RedisClient::Drop() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisClient::EnsureConnected() {
  if (ctx_) return Status::Ok();
  FERRY_RETURN_IF_ERROR(ConnectContext(endpoint_, timeout_ms_, &ctx_));
  if (endpoint_.db != 0) {
    std::string db = std::to_string(endpoint_.db);
    RedisReply reply;
    Status s = Command({"SELECT", db}, &reply);
    if (!s.ok()) {
      Drop();  // an error reply leaves the connection up, on the wrong database
      return s;
    }
  }
  return Status::Ok();
}

void RedisClient::Append(const std::vector<std::string_view>& argv) {
  AppendCommand(argv, /*by_ref=*/false);
}

void RedisClient::AppendByRef(const std::vector<std::string_view>& argv) {
  AppendCommand(argv, /*by_ref=*/true);
}

void RedisClient::AppendCommand(const std::vector<std::string_view>& argv, bool by_ref) {
  if (argv.empty()) return;
  size_t need = 16;
  for (auto a : argv) need += (by_ref && a.size() >= kByRefBytes ? 0 : a.size()) + 24;
  queued_.reserve(queued_.size() + need);
  auto header = [this](char kind, size_t n) {
    char digits[24];
    auto end = std::to_chars(digits, digits + sizeof(digits), n).ptr;
    queued_.push_back(kind);
    queued_.append(digits, end);
    queued_.append("\r\n", 2);
  };
  header('*', argv.size());
  for (auto a : argv) {
    header('$', a.size());
    if (by_ref && a.size() >= kByRefBytes)
      refs_.emplace_back(queued_.size(), a);
    else
      queued_.append(a.data(), a.size());
    queued_.append("\r\n", 2);
  }
  ++pending_;
}

Status RedisClient::WriteQueued(const std::string& commands,
                                const std::vector<std::pair<size_t, std::string_view>>& refs) {
  std::vector<iovec> iov;
  iov.reserve(2 * refs.size() + 1);
  size_t at = 0;
  for (const auto& [offset, bytes] : refs) {
    if (offset > at) iov.push_back({const_cast<char*>(commands.data() + at), offset - at});
    iov.push_back({const_cast<char*>(bytes.data()), bytes.size()});
    at = offset;
  }
  if (commands.size() > at)
    iov.push_back({const_cast<char*>(commands.data() + at), commands.size() - at});
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t n = writev(ctx_->fd, iov.data() + first, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why =
          errno == EAGAIN || errno == EWOULDBLOCK ? "write timed out" : std::strerror(errno);
      Drop();
      return Status::Unavailable("redis write: " + why);
    }
    size_t done = static_cast<size_t>(n);  // skip what went out
    while (first < iov.size() && done >= iov[first].iov_len) done -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return Status::Ok();
}

Status RedisClient::Flush(std::vector<RedisReply>* replies) {
  if (replies) replies->clear();
  std::string commands;
  commands.swap(queued_);
  std::vector<std::pair<size_t, std::string_view>> refs;
  refs.swap(refs_);
  const size_t n = pending_;
  pending_ = 0;
  if (n == 0) return Status::Ok();
  FERRY_RETURN_IF_ERROR(EnsureConnected());
  if (!refs.empty()) {
    FERRY_RETURN_IF_ERROR(WriteQueued(commands, refs));
  } else if (redisAppendFormattedCommand(ctx_, commands.data(), commands.size()) != REDIS_OK) {
    std::string why = ctx_->errstr;
    Drop();
    return Status::Unavailable("redis append: " + why);
  }
  Status first_error;
  for (size_t i = 0; i < n; ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      std::string why = ctx_->errstr[0] ? ctx_->errstr : "connection lost";
      Drop();
      return Status::Unavailable("redis: " + why);
    }
    auto* r = static_cast<redisReply*>(raw);
    if (r->type == REDIS_REPLY_ERROR && first_error.ok())
      first_error = Status::Internal("redis: " + std::string(r->str, r->len));
    if (replies) replies->push_back(Convert(r));
    freeReplyObject(r);
  }
  return replies ? Status::Ok() : first_error;
}

Status RedisClient::Command(const std::vector<std::string_view>& argv, RedisReply* reply) {
  Append(argv);
  std::vector<RedisReply> replies;
  FERRY_RETURN_IF_ERROR(Flush(&replies));
  *reply = std::move(replies.at(0));
  if (reply->type == RedisReply::Type::kError) return Status::Internal("redis: " + reply->str);
  return Status::Ok();
}

Status RedisClient::Get(std::string_view key, std::string* value, bool* found) {
  std::vector<std::optional<std::string>> values;
  FERRY_RETURN_IF_ERROR(GetMany({key}, &values));
  *found = values[0].has_value();
  if (*found) *value = std::move(*values[0]);
  return Status::Ok();
}

namespace {

// Reads RESP replies straight from a socket: header lines through a small staging buffer, bulk
// bodies directly into their destination.
class SocketReader {
 public:
  explicit SocketReader(int fd) : fd_(fd) {}

  // One line without its CR LF.
  Status Line(std::string* line) {
    while (true) {
      const size_t end = staged_.find("\r\n", pos_);
      if (end != std::string::npos) {
        line->assign(staged_, pos_, end - pos_);
        pos_ = end + 2;
        return Status::Ok();
      }
      if (staged_.size() - pos_ > 64 * 1024)
        return Status(codes::kMalformed, "reply line too long");
      FERRY_RETURN_IF_ERROR(Fill());
    }
  }

  // Exactly `n` bytes into `dst`: what is staged first, the rest from the socket.
  Status Exact(char* dst, size_t n) {
    const size_t have = std::min(n, staged_.size() - pos_);
    std::memcpy(dst, staged_.data() + pos_, have);
    pos_ += have;
    for (size_t got = have; got < n;) {
      const ssize_t r = recv(fd_, dst + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      FERRY_RETURN_IF_ERROR(Failure(r));
    }
    return Status::Ok();
  }

  bool drained() const { return pos_ == staged_.size(); }

 private:
  Status Fill() {
    if (pos_ > 0) {
      staged_.erase(0, pos_);
      pos_ = 0;
    }
    char buf[16 * 1024];
    while (true) {
      const ssize_t r = recv(fd_, buf, sizeof(buf), 0);
      if (r > 0) {
        staged_.append(buf, static_cast<size_t>(r));
        return Status::Ok();
      }
      FERRY_RETURN_IF_ERROR(Failure(r));
    }
  }
  // Ok for EINTR (try again); unavailable otherwise.
  static Status Failure(ssize_t r) {
    if (r < 0 && errno == EINTR) return Status::Ok();
    if (r == 0) return Status::Unavailable("redis closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Unavailable("redis read timed out");
    return Status::Unavailable(std::string("redis read: ") + std::strerror(errno));
  }

  int fd_;
  std::string staged_;
  size_t pos_ = 0;
};

}  // namespace

Status RedisClient::GetMany(const std::vector<std::string_view>& keys,
                            std::vector<std::optional<std::string>>* values, bool consume) {
  values->assign(keys.size(), std::nullopt);
  if (keys.empty()) return Status::Ok();
  FERRY_RETURN_IF_ERROR(EnsureConnected());
  // Everything queued before goes first; its replies would be read here: not allowed.
  if (pending_ != 0) return Status::Internal("GetMany with commands queued");
  for (auto key : keys) Append({consume ? "GETDEL" : "GET", key});
  if (ctx_->reader->len > ctx_->reader->pos) {  // hiredis holds unread bytes: read through it
    std::vector<RedisReply> replies;
    FERRY_RETURN_IF_ERROR(Flush(&replies));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (replies[i].type == RedisReply::Type::kError)
        return Status::Internal("redis: " + replies[i].str);
      if (replies[i].type == RedisReply::Type::kString) (*values)[i] = std::move(replies[i].str);
    }
    return Status::Ok();
  }
  std::string commands;
  commands.swap(queued_);
  pending_ = 0;
  FERRY_RETURN_IF_ERROR(WriteQueued(commands, {}));
  SocketReader reader(ctx_->fd);
  Status error;
  std::string line;
  for (size_t i = 0; i < keys.size(); ++i) {
    Status s = reader.Line(&line);
    if (s.ok() && line.empty()) s = Status(codes::kMalformed, "empty reply line");
    if (s.ok() && line[0] == '-') {
      if (error.ok()) error = Status::Internal("redis: " + line.substr(1));
      continue;
    }
    if (s.ok() && line[0] != '$') s = Status(codes::kMalformed, "GET answered " + line);
    int64_t len = -1;
    if (s.ok() &&
        std::from_chars(line.data() + 1, line.data() + line.size(), len).ec != std::errc())
      s = Status(codes::kMalformed, "bad bulk length " + line);
    if (s.ok() && len >= 0) {
      std::string& v = (*values)[i].emplace();
      v.resize(static_cast<size_t>(len));
      char crlf[2];
      s = reader.Exact(v.data(), v.size());
      if (s.ok()) s = reader.Exact(crlf, 2);
    }
    if (!s.ok()) {
      Drop();  // the stream is out of step: reconnect next time
      return s;
    }
  }
  if (!reader.drained()) {
    Drop();
    return Status(codes::kMalformed, "redis sent more than the replies asked for");
  }
  return error;
}

// ---- RedisSubscriber -------------------------------------------------------------------------

Status RedisSubscriber::Connect(const RedisEndpoint& endpoint, int timeout_ms,
                                const std::string& channel, std::unique_ptr<RedisSubscriber>* out) {
  redisContext* ctx = nullptr;
  FERRY_RETURN_IF_ERROR(ConnectContext(endpoint, timeout_ms, &ctx));
  auto fail = [&](const std::string& why) {
    redisFree(ctx);
    return Status::Unavailable("redis " + endpoint.host + ":" + std::to_string(endpoint.port) +
                               ": " + why);
  };
  // A subscriber only reads: without keepalive probes a peer that vanished without a FIN/RST (a
  // dead host, a NAT that forgot the flow) would leave it waiting for good.
  redisEnableKeepAlive(ctx);
  auto* r =
      static_cast<redisReply*>(redisCommand(ctx, "SUBSCRIBE %b", channel.data(), channel.size()));
  if (!r) return fail(ctx->errstr[0] ? ctx->errstr : "connection lost");
  // The confirmation: ["subscribe", channel, 1].
  const bool confirmed = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                         r->element[0]->type == REDIS_REPLY_STRING &&
                         std::string_view(r->element[0]->str, r->element[0]->len) == "subscribe";
  const std::string what =
      r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "unexpected reply to SUBSCRIBE";
  freeReplyObject(r);
  if (!confirmed) return fail(what);
  // From now on reads never block: a spurious wake-up reads nothing instead of stalling the
  // polling thread (hiredis treats EAGAIN as "try later" only without REDIS_BLOCK).
  const int flags = fcntl(ctx->fd, F_GETFL);
  if (flags < 0 || fcntl(ctx->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return fail(std::string("fcntl: ") + std::strerror(errno));
  ctx->flags &= ~REDIS_BLOCK;
  out->reset(new RedisSubscriber(ctx));
  return Status::Ok();
}

RedisSubscriber::~RedisSubscriber() { redisFree(ctx_); }

int RedisSubscriber::fd() const { return ctx_->fd; }

Status RedisSubscriber::ReadAvailable(
    const std::function<void(std::string_view payload)>& on_message) {
  if (ctx_->err) return Status::Unavailable(std::string("redis subscriber: ") + ctx_->errstr);
  if (redisBufferRead(ctx_) != REDIS_OK)
    return Status::Unavailable(std::string("redis subscriber: ") + ctx_->errstr);
  while (true) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK)
      return Status::Unavailable(std::string("redis subscriber: ") + ctx_->errstr);
    if (raw == nullptr) return Status::Ok();  // no complete reply buffered
    // Freed even when on_message throws.
    std::unique_ptr<redisReply, void (*)(void*)> owned(static_cast<redisReply*>(raw),
                                                       freeReplyObject);
    const redisReply* r = owned.get();
    // ["message", channel, payload]; anything else (a confirmation) is skipped.
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[2]->type == REDIS_REPLY_STRING &&
        std::string_view(r->element[0]->str, r->element[0]->len) == "message") {
      on_message(std::string_view(r->element[2]->str, r->element[2]->len));
    }
  }
}

}  // namespace ferry::protocol
