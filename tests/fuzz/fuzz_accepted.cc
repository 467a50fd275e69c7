// The broker's replies to a SUBMIT as the SDK reads them (producer-sdk/src/client_submit.cc):
// ACCEPTED {"ids", "rejected"?: [{"id"?, "code", "message"}], "rid"?} through
// protocol::DecodeAccepted, and ERROR {"code", "message", "rid"?} through protocol::DecodeError;
// and its LIMITS answer (producer-sdk/src/io_thread.cc) through protocol::DecodeLimits.
// Invariants: EncodeAccepted / EncodeError / EncodeLimits -> decode give the same reply.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace protocol = ferry::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  protocol::Accepted a;
  if (protocol::DecodeAccepted(oh.get(), &a).ok()) {
    const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeAccepted(a));
    msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
    protocol::Accepted back;
    FUZZ_CHECK_OK(protocol::DecodeAccepted(again.get(), &back));
    FUZZ_CHECK(back.rid == a.rid && back.ids == a.ids && back.rejected.size() == a.rejected.size());
    for (size_t i = 0; i < a.rejected.size(); ++i) {
      FUZZ_CHECK(back.rejected[i].id == a.rejected[i].id);
      FUZZ_CHECK(back.rejected[i].code == a.rejected[i].code);
      FUZZ_CHECK(back.rejected[i].message == a.rejected[i].message);
    }
  }
  ferry::Status error;
  if (protocol::DecodeError(oh.get(), &error).ok()) {
    int64_t rid = 0;
    if (!protocol::GetInt(oh.get(), "rid", &rid, 0).ok()) rid = 0;
    const std::string bytes =
        ferry::fuzz::Bytes(protocol::EncodeError(rid, error.code(), error.message()));
    msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
    ferry::Status back;
    FUZZ_CHECK_OK(protocol::DecodeError(again.get(), &back));
    FUZZ_CHECK(back.code() == error.code() && back.message() == error.message());
  }
  protocol::BrokerLimits limits;
  if (protocol::DecodeLimits(oh.get(), &limits).ok()) {
    FUZZ_CHECK(limits.max_message_bytes >= 1024 && limits.max_jobs_per_message >= 1);
    const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeLimits(limits, 7));
    msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);  // views into `bytes`
    protocol::BrokerLimits back;
    FUZZ_CHECK_OK(protocol::DecodeLimits(again.get(), &back));
    FUZZ_CHECK(back.max_message_bytes == limits.max_message_bytes &&
               back.max_job_bytes == limits.max_job_bytes &&
               back.max_jobs_per_message == limits.max_jobs_per_message);
  }
  return 0;
}
