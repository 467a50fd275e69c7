#include "result_store.h"

#include "ferry/protocol/messages.h"

namespace ferry::client {

Status ResultStore::Acquire(std::unique_ptr<protocol::RedisClient>* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      *out = std::move(idle_.back());
      idle_.pop_back();
      return Status::Ok();
    }
  }
  return protocol::RedisClient::Connect(endpoint_, timeout_ms_, out);  // outside the lock
}

void ResultStore::Release(std::unique_ptr<protocol::RedisClient> conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(conn));
}

Status ResultStore::Read(const std::string& id, Result* out) {
  *out = Result();
  out->id = id;
  std::unique_ptr<protocol::RedisClient> conn;
  FERRY_RETURN_IF_ERROR(Acquire(&conn));
  std::string value;
  bool found = false;
  // A failed GET drops the connection inside RedisClient; the next use reconnects, so the
  // client goes back to the pool either way.
  Status s = conn->Get(keys_.Result(id), &value, &found);
  Release(std::move(conn));
  FERRY_RETURN_IF_ERROR(s);
  if (!found) return Status::Ok();
  s = protocol::DecodeResult(value.data(), value.size(), out);
  if (!s.ok()) {
    Status bad(s.code(), "result record for \"" + id + "\": " + s.message());
    *out = Result();
    out->id = id;
    return bad;
  }
  return Status::Ok();
}

}  // namespace ferry::client
