#include "ferry/protocol/hello_check.h"

#include <set>
#include <string>

#include "ferry/protocol/util.h"

namespace ferry::protocol {
namespace {

// 1..max characters of printable ASCII (no space).
bool PrintableName(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s)
    if (c <= 0x20 || c >= 0x7f) return false;
  return true;
}

// Model names: 1-128 characters of [A-Za-z0-9._:/-] (they become metric labels, log fields,
// Redis hash fields and CLI output).
bool ValidModelName(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Input names in a READY's "inputs": 1-64 characters of [A-Za-z0-9._-].
bool ValidInputName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Status CheckHello(const protocol::WorkerHello& h) {
  if (!PrintableName(h.worker, 128))
    return Status::InvalidArgument("READY \"worker\" must be 1-128 printable characters");
  if (!h.device.empty() && !PrintableName(h.device, 64))
    return Status::InvalidArgument("READY \"device\" must be at most 64 printable characters");
  if (!h.host.empty() && !PrintableName(h.host, 255))
    return Status::InvalidArgument("READY \"host\" must be at most 255 printable characters");
  if (h.pid < 0) return Status::InvalidArgument("READY \"pid\" must not be negative");
  if (h.redis_prefix && h.redis_prefix->size() > 1024)
    return Status::InvalidArgument("READY \"redis_prefix\" must be at most 1024 bytes");
  if (h.heartbeat_ms != 0 && (h.heartbeat_ms < kMinHeartbeatMs || h.heartbeat_ms > kMaxHeartbeatMs))
    return Status::InvalidArgument("READY \"heartbeat_ms\" must be " +
                                   std::to_string(kMinHeartbeatMs) + ".." +
                                   std::to_string(kMaxHeartbeatMs));
  if (h.capacity < 1 || h.capacity > kMaxWorkerCapacity)
    return Status::InvalidArgument("READY \"capacity\" must be 1.." +
                                   std::to_string(kMaxWorkerCapacity));
  if (h.models.empty() || h.models.size() > kMaxModelsPerWorker)
    return Status::InvalidArgument("READY must announce 1.." + std::to_string(kMaxModelsPerWorker) +
                                   " models");
  std::set<std::string> names;
  for (const auto& mi : h.models) {
    if (!ValidModelName(mi.name))
      return Status::InvalidArgument("READY model name \"" + Printable(mi.name) +
                                     "\": 1-128 characters of [A-Za-z0-9._:/-]");
    if (mi.max_batch < 1 || mi.max_batch > kMaxModelBatch)
      return Status::InvalidArgument("READY max_batch of \"" + mi.name + "\" must be 1.." +
                                     std::to_string(kMaxModelBatch));
    if (!names.insert(mi.name).second)
      return Status::InvalidArgument("READY announces \"" + mi.name + "\" twice");
    // "inputs": count, rank, dims and dtypes were checked by DecodeHello; the names here.
    if (mi.inputs) {
      for (const auto& in : *mi.inputs)
        if (!in.name.empty() && !ValidInputName(in.name))
          return Status::InvalidArgument("READY input name \"" + Printable(in.name) + "\" of \"" +
                                         mi.name + "\": 1-64 characters of [A-Za-z0-9._-]");
    }
  }
  if (h.resident) {
    for (const auto& r : *h.resident)
      if (names.count(r) == 0)
        return Status::InvalidArgument("READY \"resident\" names \"" + Printable(r) +
                                       "\", which it does not announce");
  }
  if (static_cast<int64_t>(h.held.size()) > h.capacity)
    return Status::InvalidArgument("READY \"held\" lists " + std::to_string(h.held.size()) +
                                   " jobs, more than its capacity " + std::to_string(h.capacity));
  for (const auto& id : h.held)
    if (!IsValidJobId(id))
      return Status::InvalidArgument("READY \"held\" names \"" + Printable(id) +
                                     "\", which is no job id");
  return Status::Ok();
}

}  // namespace ferry::protocol
