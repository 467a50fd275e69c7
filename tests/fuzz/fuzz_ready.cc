// READY bodies as the broker's backend reads them (broker/src/backend.cc): a worker's hello
// through protocol::DecodeHello (protocol/src/messages.cc). Invariants: an accepted hello has
// capacity >= 1 and every max_batch >= 1, and EncodeHello -> DecodeHello gives the same hello.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace {

namespace protocol = ferry::protocol;

bool Same(const protocol::WorkerHello& a, const protocol::WorkerHello& b) {
  if (a.worker != b.worker || a.device != b.device || a.host != b.host || a.pid != b.pid ||
      a.capacity != b.capacity || a.models.size() != b.models.size() || a.resident != b.resident ||
      a.held != b.held)
    return false;
  for (size_t i = 0; i < a.models.size(); ++i)
    if (a.models[i].name != b.models[i].name || a.models[i].max_batch != b.models[i].max_batch)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  protocol::WorkerHello hello;
  if (!protocol::DecodeHello(oh.get(), &hello).ok()) return 0;
  FUZZ_CHECK(hello.capacity >= 1);
  for (const auto& m : hello.models) FUZZ_CHECK(m.max_batch >= 1);
  const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeHello(hello));
  msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
  protocol::WorkerHello back;
  FUZZ_CHECK_OK(protocol::DecodeHello(again.get(), &back));
  FUZZ_CHECK(Same(hello, back));
  return 0;
}
