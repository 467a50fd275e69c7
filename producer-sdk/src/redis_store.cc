#include "redis_store.h"

#include <optional>

#include "ferry/protocol/messages.h"

namespace ferry::client {

Status RedisStore::Acquire(std::unique_ptr<protocol::RedisClient>* out, int timeout_ms,
                           bool* bounded) {
  const bool shorter = timeout_ms > 0 && timeout_ms < timeout_ms_;
  if (bounded) *bounded = shorter;
  std::unique_ptr<protocol::RedisClient> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      conn = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  // Redis may have closed it while it was idle (a restart, its `timeout`, a proxy's idle limit):
  // then it is dropped here and the command connects again, instead of failing `unavailable`.
  if (conn) (void)conn->DroppedByPeer();
  if (!conn)  // outside the lock
    FERRY_RETURN_IF_ERROR(
        protocol::RedisClient::Connect(endpoint_, shorter ? timeout_ms : timeout_ms_, &conn));
  if (shorter) conn->SetTimeout(timeout_ms);
  *out = std::move(conn);
  return Status::Ok();
}

void RedisStore::Release(std::unique_ptr<protocol::RedisClient> conn, bool bounded) {
  if (bounded) conn->SetTimeout(timeout_ms_);
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(conn));
}

Status RedisStore::Read(const std::string& id, Result* out, bool consume, int timeout_ms) {
  *out = Result();
  out->id = id;
  std::unique_ptr<protocol::RedisClient> conn;
  bool bounded = false;
  FERRY_RETURN_IF_ERROR(Acquire(&conn, timeout_ms, &bounded));
  // A failed read drops the connection inside RedisClient; the next use reconnects, so the
  // client goes back to the pool either way (with the store's timeout again).
  const std::string key = keys_.Result(id);
  std::vector<std::optional<std::string>> values;
  Status s = conn->GetMany({key}, &values);
  // Deleted only now that the whole record is here (a GETDEL whose reply were cut off would have
  // lost it), and at once: Redis reuses the memory for the next result (with a deleter thread
  // later, several results alive at once, 1 MB results ran at 0.85-0.88x in paired runs). Within
  // the read's bound too: one that runs out leaves the result to expire.
  if (s.ok() && consume && values[0]) (void)DeleteResultKeys(conn.get(), {key});
  Release(std::move(conn), bounded);
  if (s.code() == codes::kInternal && s.message().find("WRONGTYPE") != std::string::npos)
    return Status(codes::kMalformed, "result record for \"" + id +
                                         "\": the key holds no string, so no Ferry result (" +
                                         s.message() + ")");
  FERRY_RETURN_IF_ERROR(s);
  if (!values[0]) return Status::Ok();
  s = protocol::DecodeResult(std::move(*values[0]), out);  // big outputs keep its buffer
  if (!s.ok()) {
    Status bad(s.code(), "result record for \"" + id + "\": " + s.message());
    *out = Result();
    out->id = id;
    return bad;
  }
  return Status::Ok();
}

Status RedisStore::DeleteResults(const std::vector<std::string>& ids) {
  std::unique_ptr<protocol::RedisClient> conn;
  FERRY_RETURN_IF_ERROR(Acquire(&conn));
  std::vector<std::string> keys;
  keys.reserve(ids.size());
  for (const auto& id : ids) keys.push_back(keys_.Result(id));
  Status s = DeleteResultKeys(conn.get(), std::vector<std::string_view>(keys.begin(), keys.end()));
  Release(std::move(conn));
  return s;
}

Status RedisStore::DeleteResultKeys(protocol::RedisClient* conn,
                                    const std::vector<std::string_view>& keys) {
  if (!del_refused_.load(std::memory_order_relaxed)) {
    std::vector<std::string_view> argv{"DEL"};
    argv.insert(argv.end(), keys.begin(), keys.end());
    protocol::RedisReply reply;
    Status s = conn->Command(argv, &reply);
    if (s.ok() || reply.type != protocol::RedisReply::Type::kError ||
        reply.str.rfind("NOPERM", 0) != 0)
      return s;
    // An ACL user of before this SDK (deploy/redis/users.acl gave producers GETDEL on results,
    // not DEL): GETDEL then, its values skipped as they arrive, from now on.
    del_refused_.store(true, std::memory_order_relaxed);
  }
  std::vector<bool> found;
  return conn->GetManyInto(
      keys, [](size_t, size_t) -> char* { return nullptr; }, &found, /*consume=*/true);
}

Status RedisStore::PutInputs(const std::vector<std::string>& keys,
                             const std::vector<std::string_view>& values, int64_t ttl_s,
                             int timeout_ms) {
  if (keys.empty()) return Status::Ok();
  std::unique_ptr<protocol::RedisClient> conn;
  bool bounded = false;
  FERRY_RETURN_IF_ERROR(Acquire(&conn, timeout_ms, &bounded));
  const std::string ttl = std::to_string(ttl_s);
  // By reference: the values (the caller's tensors) go from where they are, not copied.
  for (size_t i = 0; i < keys.size(); ++i)
    conn->AppendByRef({"SET", keys[i], values[i], "EX", ttl});
  Status s = conn->Flush(nullptr);  // the first error reply, if any
  Release(std::move(conn), bounded);
  return s;
}

Status RedisStore::Delete(const std::vector<std::string>& keys, int timeout_ms) {
  if (keys.empty()) return Status::Ok();
  std::unique_ptr<protocol::RedisClient> conn;
  bool bounded = false;
  FERRY_RETURN_IF_ERROR(Acquire(&conn, timeout_ms, &bounded));
  std::vector<std::string_view> argv{"DEL"};
  for (const auto& k : keys) argv.push_back(k);
  protocol::RedisReply reply;
  Status s = conn->Command(argv, &reply);
  if (!bounded && s.code() == codes::kUnavailable && !conn->connected())
    s = conn->Command(argv, &reply);  // it reconnects
  Release(std::move(conn), bounded);
  return s;
}

}  // namespace ferry::client
