#include "ferry/protocol/redis.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>

#include "ferry/protocol/redis_errors.h"
#include "redis_transport.h"

namespace ferry::protocol {

namespace {

// An error reply as a Status: unavailable when it goes away by itself (LOADING, BUSY, OOM, ...:
// the caller retries, as when Redis is down), else internal.
Status ReplyError(std::string_view text) {
  std::string message = "redis: " + std::string(text);
  return IsTransientRedisError(text) ? Status::Unavailable(std::move(message))
                                     : Status::Internal(std::move(message));
}

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

void RedisClient::Drop() { conn_.reset(); }

bool RedisClient::DroppedByPeer() {
  if (!conn_ || pending_ > 0 || conn_->buffered()) return false;
  pollfd p{conn_->transport().fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  Drop();
  return true;
}

void RedisClient::SetTimeout(int timeout_ms) {
  if (timeout_ms <= 0 || timeout_ms == timeout_ms_) return;
  timeout_ms_ = timeout_ms;
  if (conn_ && !conn_->transport().SetTimeout(timeout_ms))
    Drop();  // the next call reconnects with the new timeout
}

Status RedisClient::EnsureConnected() {
  if (conn_) return Status::Ok();
  // A refused AUTH or SELECT fails the connection: never a connection on the wrong database or
  // as the default user.
  Status s = RedisConnection::Open(endpoint_, timeout_ms_, /*keepalive=*/false, /*select=*/true,
                                   /*ping=*/false, &conn_);
  if (s.ok()) ++connects_;
  return s;
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
  Status s = conn_->transport().Write(iov.data(), iov.size());
  if (!s.ok()) Drop();
  return s;
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
  FERRY_RETURN_IF_ERROR(WriteQueued(commands, refs));
  Status first_error;
  for (size_t i = 0; i < n; ++i) {
    redisReply* r = nullptr;
    if (Status s = conn_->ReadReply(&r); !s.ok()) {
      Drop();
      return s;
    }
    if (r->type == REDIS_REPLY_ERROR && first_error.ok())
      first_error = ReplyError(std::string_view(r->str, r->len));
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
  if (reply->type == RedisReply::Type::kError) return ReplyError(reply->str);
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
  explicit SocketReader(RedisTransport* transport) : transport_(transport) {}

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
      size_t r = 0;
      FERRY_RETURN_IF_ERROR(transport_->Read(dst + got, n - got, &r));
      got += r;
    }
    return Status::Ok();
  }

  // Exactly `n` bytes read and dropped: what is staged first, the rest from the socket through
  // a small buffer (a value nobody wants costs no memory).
  Status Skip(size_t n) {
    const size_t have = std::min(n, staged_.size() - pos_);
    pos_ += have;
    char scratch[16 * 1024];
    for (size_t left = n - have; left > 0;) {
      size_t r = 0;
      FERRY_RETURN_IF_ERROR(transport_->Read(scratch, std::min(left, sizeof(scratch)), &r));
      left -= r;
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
    size_t r = 0;
    FERRY_RETURN_IF_ERROR(transport_->Read(buf, sizeof(buf), &r));
    staged_.append(buf, r);
    return Status::Ok();
  }

  RedisTransport* transport_;
  std::string staged_;
  size_t pos_ = 0;
};

// Where value i's `size` bytes go; an exception from `into` (no memory for a huge value) as
// a Status, so that the caller drops the connection instead of leaving it out of step.
Status Destine(const RedisClient::Destination& into, size_t i, size_t size, char** dst) {
  try {
    *dst = into(i, size);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Internal("no room for a value of " + std::to_string(size) +
                            " bytes: " + e.what());
  }
}

constexpr int64_t kMaxBulkBytes = int64_t{512} << 20;

}  // namespace

Status RedisClient::GetMany(const std::vector<std::string_view>& keys,
                            std::vector<std::optional<std::string>>* values, bool consume) {
  values->assign(keys.size(), std::nullopt);
  std::vector<bool> found;
  return GetManyInto(
      keys,
      [values](size_t i, size_t size) {
        std::string& v = (*values)[i].emplace();
        v.resize(size);
        return v.data();
      },
      &found, consume);
}

Status RedisClient::GetManyInto(const std::vector<std::string_view>& keys, const Destination& into,
                                std::vector<bool>* found, bool consume,
                                std::vector<std::string>* errors) {
  found->assign(keys.size(), false);
  if (errors) errors->assign(keys.size(), std::string());
  if (keys.empty()) return Status::Ok();
  FERRY_RETURN_IF_ERROR(EnsureConnected());
  // Everything queued before goes first; its replies would be read here: not allowed.
  if (pending_ != 0) return Status::Internal("GetMany with commands queued");
  // Key i's error reply: kept for the caller, or the first one fails the call.
  Status error;
  auto refused = [&](size_t i, std::string text) {
    if (errors)
      (*errors)[i] = std::move(text);
    else if (error.ok())
      error = ReplyError(text);
  };
  for (auto key : keys) Append({consume ? "GETDEL" : "GET", key});
  if (conn_->buffered()) {  // the parser holds unread bytes: read through it
    std::vector<RedisReply> replies;
    FERRY_RETURN_IF_ERROR(Flush(&replies));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (replies[i].type == RedisReply::Type::kError) {
        refused(i, std::move(replies[i].str));
        continue;
      }
      if (replies[i].type != RedisReply::Type::kString) continue;
      const std::string& v = replies[i].str;
      char* dst = nullptr;
      FERRY_RETURN_IF_ERROR(Destine(into, i, v.size(), &dst));
      if (dst != nullptr && !v.empty()) std::memcpy(dst, v.data(), v.size());
      (*found)[i] = true;
    }
    return error;
  }
  std::string commands;
  commands.swap(queued_);
  pending_ = 0;
  FERRY_RETURN_IF_ERROR(WriteQueued(commands, {}));
  SocketReader reader(&conn_->transport());
  std::string line;
  for (size_t i = 0; i < keys.size(); ++i) {
    Status s = reader.Line(&line);
    if (s.ok() && line.empty()) s = Status(codes::kMalformed, "empty reply line");
    if (s.ok() && line[0] == '-') {
      refused(i, line.substr(1));
      continue;
    }
    if (s.ok() && line[0] != '$') s = Status(codes::kMalformed, "GET answered " + line);
    int64_t len = -1;
    if (s.ok() &&
        std::from_chars(line.data() + 1, line.data() + line.size(), len).ec != std::errc())
      s = Status(codes::kMalformed, "bad bulk length " + line);
    // No value Ferry writes comes near 512 MiB (Redis's default proto-max-bulk-len): a longer
    // one is a peer that lies (a proxy, a middlebox on plain TCP), and would have us allocate
    // what it says.
    if (s.ok() && len > kMaxBulkBytes)
      s = Status(codes::kMalformed,
                 "bulk length " + line.substr(1) + " over the 512 MiB a Ferry value can be");
    if (s.ok() && len >= 0) {
      const size_t size = static_cast<size_t>(len);
      char* dst = nullptr;
      s = Destine(into, i, size, &dst);
      (*found)[i] = true;
      char crlf[2];
      if (s.ok()) s = dst != nullptr ? reader.Exact(dst, size) : reader.Skip(size);
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

RedisSubscriber::RedisSubscriber(std::unique_ptr<RedisConnection> conn) : conn_(std::move(conn)) {}

Status RedisSubscriber::Connect(const RedisEndpoint& endpoint, int timeout_ms,
                                const std::string& channel, std::unique_ptr<RedisSubscriber>* out) {
  // A subscriber only reads: without keepalive probes a peer that vanished without a FIN/RST (a
  // dead host, a NAT that forgot the flow) would leave it waiting for good. Pub/Sub channels
  // are not per database: no SELECT.
  std::unique_ptr<RedisConnection> conn;
  FERRY_RETURN_IF_ERROR(RedisConnection::Open(endpoint, timeout_ms, /*keepalive=*/true,
                                              /*select=*/false, /*ping=*/false, &conn));
  auto fail = [&](const std::string& why) {
    return Status::Unavailable("redis " + endpoint.Address() + ": " + why);
  };
  std::string command;
  AppendRespCommand(&command, {"SUBSCRIBE", channel});
  const iovec iov{command.data(), command.size()};
  FERRY_RETURN_IF_ERROR(conn->transport().Write(&iov, 1));
  redisReply* raw = nullptr;
  if (Status s = conn->ReadReply(&raw); !s.ok()) return fail(s.message());
  std::unique_ptr<redisReply, void (*)(void*)> r(raw, freeReplyObject);
  // The confirmation: ["subscribe", channel, 1].
  const bool confirmed = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                         r->element[0]->type == REDIS_REPLY_STRING &&
                         std::string_view(r->element[0]->str, r->element[0]->len) == "subscribe";
  if (!confirmed)
    return fail(r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                             : "unexpected reply to SUBSCRIBE");
  // From now on reads never block: a spurious wake-up reads nothing instead of stalling the
  // polling thread.
  FERRY_RETURN_IF_ERROR(conn->transport().SetNonBlocking());
  out->reset(new RedisSubscriber(std::move(conn)));
  return Status::Ok();
}

RedisSubscriber::~RedisSubscriber() = default;

int RedisSubscriber::fd() const { return conn_ ? conn_->transport().fd() : -1; }

Status RedisSubscriber::ReadAvailable(
    const std::function<void(std::string_view payload)>& on_message) {
  if (!conn_) return Status::Unavailable("redis subscriber: closed");
  RedisTransport& transport = conn_->transport();
  char buf[16 * 1024];
  while (true) {
    size_t got = 0;
    Status s = transport.ReadNow(buf, sizeof(buf), &got);
    if (s.ok()) s = conn_->Feed(buf, got);
    if (!s.ok()) {
      conn_.reset();
      return Status::Unavailable("redis subscriber: " + s.message());
    }
    // Plain TCP: one read, what is left the next poll shows. TLS: until OpenSSL holds nothing.
    if (got == 0 || !transport.tls()) break;
  }
  while (true) {
    void* raw = nullptr;
    if (redisReaderGetReply(conn_->reader(), &raw) != REDIS_OK) {
      const std::string why = conn_->reader()->errstr;
      conn_.reset();
      return Status::Unavailable("redis subscriber: protocol error: " + why);
    }
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

Status CheckRedisAccess(const RedisEndpoint& endpoint, int timeout_ms, bool* refused) {
  std::unique_ptr<RedisConnection> conn;
  return RedisConnection::Open(endpoint, timeout_ms, /*keepalive=*/false, /*select=*/true,
                               /*ping=*/endpoint.password.empty(), &conn, refused);
}

}  // namespace ferry::protocol
