// Client: Create, Stats, Cancel, and the forwarding of every call to Client::Impl
// (client_impl.h); the submit path is in client_submit.cc.
#include "ferry/client.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "client_impl.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/util.h"
#include "ferry/protocol/wire.h"

namespace ferry::client {

Status CheckReply(const IoThread::Reply& reply, std::string_view expected,
                  msgpack::object_handle* body) {
  FERRY_RETURN_IF_ERROR(protocol::UnpackMap(reply.body.data(), reply.body.size(), body));
  if (reply.command == protocol::kError) {
    Status error;
    FERRY_RETURN_IF_ERROR(protocol::DecodeError(body->get(), &error));
    return error.ok() ? Status::Internal("broker sent ERROR with an empty code") : error;
  }
  if (reply.command != expected) {
    return Status(codes::kMalformed, "broker answered " + reply.command + " where " +
                                         std::string(expected) + " was expected");
  }
  return Status::Ok();
}

Status Client::Impl::Stats(std::string* json) {
  int64_t rid = io_->NextRid();
  IoThread::Reply reply;
  FERRY_RETURN_IF_ERROR(io_->Call(rid, protocol::kStats, protocol::EncodeEmpty(rid),
                                  options_.request_timeout_ms, &reply));
  msgpack::object_handle body;
  FERRY_RETURN_IF_ERROR(CheckReply(reply, protocol::kStats, &body));
  // Everything but our "rid".
  const msgpack::object& map = body.get();
  std::vector<msgpack::object_kv> kept;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    if (protocol::AsStringView(map.via.map.ptr[i].key) != "rid") kept.push_back(map.via.map.ptr[i]);
  }
  msgpack::object filtered;
  filtered.type = msgpack::type::MAP;
  filtered.via.map.size = static_cast<uint32_t>(kept.size());
  filtered.via.map.ptr = kept.data();
  *json = protocol::ToJson(filtered);
  return Status::Ok();
}

Status Client::Impl::Cancel(const std::vector<std::string>& ids, CancelReport* report) {
  *report = CancelReport();
  for (const auto& id : ids) {
    if (!protocol::IsValidJobId(id))
      return Status::InvalidArgument("job id \"" + id + "\" is not a valid Ferry id");
  }
  // One CANCEL per max_jobs_per_message ids and under max_message_bytes: the broker refuses
  // more ids whole, and drops the connection on a bigger frame (the I/O thread refuses to send
  // one: too_large).
  constexpr size_t kHeaderBytes = 64, kPerIdBytes = 3;  // the map, rid; each id's msgpack head
  auto append = [](std::vector<std::string>* to, std::vector<std::string>* from) {
    to->insert(to->end(), std::make_move_iterator(from->begin()),
               std::make_move_iterator(from->end()));
  };
  auto send = [&](size_t begin, size_t end) -> Status {
    std::vector<std::string> part(ids.begin() + begin, ids.begin() + end);
    int64_t rid = io_->NextRid();
    IoThread::Reply reply;
    FERRY_RETURN_IF_ERROR(io_->Call(rid, protocol::kCancel, protocol::EncodeIds(part, rid),
                                    options_.request_timeout_ms, &reply));
    msgpack::object_handle body;
    FERRY_RETURN_IF_ERROR(CheckReply(reply, protocol::kCancelled, &body));
    protocol::Cancelled c;
    FERRY_RETURN_IF_ERROR(protocol::DecodeCancelled(body.get(), &c));
    append(&report->cancelled, &c.ids);
    append(&report->running, &c.running);
    append(&report->not_found, &c.not_found);
    return Status::Ok();
  };
  size_t stopped_at = 0;
  return SendInParts(
      ids.size(), kHeaderBytes, [&](size_t i) { return ids[i].size() + kPerIdBytes; }, send,
      &stopped_at);
}

// ---- Client: forwarding; no exception leaves the SDK -------------------------------------------

namespace {
// Runs `fn`, turning an exception (std::bad_alloc, a library's) into an internal Status: every
// Client method returns a Status and nothing throws (client.h).
template <typename Fn>
Status Guarded(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Status::Internal(std::string(what) + ": " + e.what());
  } catch (...) {
    return Status::Internal(std::string(what) + ": unknown exception");
  }
}
}  // namespace

namespace {
// $name when set and not empty.
bool FromEnv(const char* name, std::string* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  *out = v;
  return true;
}
}  // namespace

ClientOptions ClientOptions::FromEnvironment() {
  ClientOptions o;
  FromEnv("FERRY_FRONTEND", &o.frontend);
  FromEnv("FERRY_REDIS", &o.redis);
  FromEnv("FERRY_REDIS_PREFIX", &o.redis_prefix);
  FromEnv("FERRY_CURVE_SERVER_PUBLIC", &o.curve_server_public);
  FromEnv("FERRY_CURVE_SECRET", &o.curve_secret);
  if (std::string limit; FromEnv("FERRY_MAX_MESSAGE_BYTES", &limit)) {
    char* end = nullptr;
    const long long v = std::strtoll(limit.c_str(), &end, 10);
    o.max_message_bytes = *end == '\0' ? v : 0;  // not a number: Create refuses 0, naming it
  }
  // As the Python client: the Redis files only where they apply to this URL, so that a plain
  // redis:// URL still works in a shell that sourced a TLS fleet's env file.
  const bool tls = o.redis.rfind("rediss://", 0) == 0;
  const size_t scheme_end = o.redis.find("://");
  const size_t at = o.redis.find('@');
  const bool has_password = scheme_end != std::string::npos && at != std::string::npos &&
                            o.redis.find(':', scheme_end + 3) < at;
  if (!has_password) FromEnv("FERRY_REDIS_PASSWORD_FILE", &o.redis_password_file);
  if (tls) {
    FromEnv("FERRY_REDIS_TLS_CA", &o.redis_tls_ca);
    FromEnv("FERRY_REDIS_TLS_CERT", &o.redis_tls_cert);
    FromEnv("FERRY_REDIS_TLS_KEY", &o.redis_tls_key);
  }
  return o;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Create(const ClientOptions& options, std::unique_ptr<Client>* out) {
  return Guarded("Create", [&] {
    protocol::RedisEndpoint redis;
    FERRY_RETURN_IF_ERROR(
        protocol::ResolveRedisEndpoint(options.redis,
                                       {options.redis_password_file, options.redis_tls_ca,
                                        options.redis_tls_cert, options.redis_tls_key},
                                       &redis));
    if (options.request_timeout_ms <= 0)
      return Status::InvalidArgument("request_timeout_ms must be > 0");
    if (options.stored_input_bytes < 0)
      return Status::InvalidArgument("stored_input_bytes must be >= 0 (0: none)");
    if (options.attached_input_bytes < 0)
      return Status::InvalidArgument("attached_input_bytes must be >= 0 (0: none)");
    if (options.max_message_bytes < 1024)
      return Status::InvalidArgument("max_message_bytes must be >= 1024 (the broker's minimum)");
    if (options.input_ttl_s <= 0 || options.input_ttl_s > 30 * 24 * 3600)
      return Status::InvalidArgument("input_ttl_s must be 1 s to 30 days");
    auto impl = std::make_unique<Impl>(options, std::move(redis));
    FERRY_RETURN_IF_ERROR(impl->Start());
    out->reset(new Client(std::move(impl)));
    return Status::Ok();
  });
}

Status Client::Submit(const Job& job, std::string* id) {
  return Guarded("Submit", [&] {
    std::vector<SubmitOutcome> outcomes;
    Status s = impl_->SubmitMany({&job}, &outcomes);
    if (id) *id = outcomes.at(0).id;
    return s.ok() ? outcomes[0].status : s;
  });
}

Status Client::SubmitMany(const std::vector<Job>& jobs, std::vector<SubmitOutcome>* outcomes) {
  return Guarded("SubmitMany", [&] {
    std::vector<const Job*> ptrs;
    ptrs.reserve(jobs.size());
    for (const Job& j : jobs) ptrs.push_back(&j);
    return impl_->SubmitMany(ptrs, outcomes);
  });
}

Status Client::Run(const Job& job, int timeout_ms, Result* out, std::string* id) {
  return Guarded("Run", [&] { return impl_->Run(job, timeout_ms, out, id); });
}

// Poll and Wait copy the id first: it may be out->id itself (Poll(r.id, &r)), which they
// overwrite.
Status Client::Poll(const std::string& id, Result* out) {
  const std::string job_id = id;
  return Guarded("Poll", [&] { return impl_->Poll(job_id, out); });
}

Status Client::Wait(const std::string& id, int timeout_ms, Result* out) {
  const std::string job_id = id;
  return Guarded("Wait", [&] {
    if (!protocol::IsValidJobId(job_id))
      return Status::InvalidArgument("job id \"" + job_id + "\" is not a valid Ferry id");
    return impl_->Wait(job_id, timeout_ms, out);
  });
}

Status Client::Stats(std::string* json) {
  return Guarded("Stats", [&] { return impl_->Stats(json); });
}

Status Client::CancelMany(const std::vector<std::string>& ids, CancelReport* report) {
  return Guarded("CancelMany", [&] { return impl_->Cancel(ids, report); });
}

Status Client::Cancel(const std::string& id) {
  return Guarded("Cancel", [&] {
    CancelReport report;
    FERRY_RETURN_IF_ERROR(impl_->Cancel({id}, &report));
    if (report.cancelled.empty() && report.running.empty())
      return Status::NotFound("job \"" + id + "\" is not pending at the broker");
    return Status::Ok();
  });
}

}  // namespace ferry::client
