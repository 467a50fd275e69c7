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

Status ResultStore::ReadMany(const std::vector<std::string>& ids, std::vector<Fetched>* out) {
  out->clear();
  out->resize(ids.size());
  if (ids.empty()) return Status::Ok();
  std::vector<std::string> keys;
  keys.reserve(ids.size());
  for (const auto& id : ids) keys.push_back(keys_.Result(id));
  std::vector<std::string_view> argv;
  argv.reserve(ids.size() + 1);
  argv.emplace_back("MGET");
  for (const auto& k : keys) argv.emplace_back(k);
  std::unique_ptr<protocol::RedisClient> conn;
  FERRY_RETURN_IF_ERROR(Acquire(&conn));
  protocol::RedisReply reply;
  Status s = conn->Command(argv, &reply);
  Release(std::move(conn));
  FERRY_RETURN_IF_ERROR(s);
  if (reply.type != protocol::RedisReply::Type::kArray || reply.elements.size() != ids.size())
    return Status(codes::kMalformed, "MGET answered something other than one value per key");
  for (size_t i = 0; i < ids.size(); ++i) {
    Fetched& f = (*out)[i];
    f.result.id = ids[i];
    const protocol::RedisReply& v = reply.elements[i];
    if (v.type != protocol::RedisReply::Type::kString) continue;  // no record yet
    f.bytes = v.str.size();
    f.status = protocol::DecodeResult(v.str.data(), v.str.size(), &f.result);
    if (!f.status.ok()) {
      f.status = Status(f.status.code(), "result record for \"" + ids[i] + "\": " +
                                             f.status.message());
      f.result = Result();
      f.result.id = ids[i];
    }
  }
  return Status::Ok();
}

}  // namespace ferry::client
