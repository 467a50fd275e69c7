// CANCEL {"ids": [...], "rid"?} as the broker's frontend and the worker's broker link read it
// (broker/src/frontend.cc HandleCancel, gpu-worker/src/broker_link.cc HandleCancel), and its
// reply CANCELLED {"ids", "running"?, "not_found"?, "rid"?} as the SDK reads it
// (producer-sdk/src/client.cc, protocol::DecodeCancelled). Invariants: EncodeIds and
// EncodeCancelled -> decode give the same lists.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace protocol = ferry::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  int64_t rid = 0;
  if (!protocol::GetInt(oh.get(), "rid", &rid, 0).ok()) rid = 0;
  std::vector<std::string> ids;
  if (protocol::GetStringArray(oh.get(), "ids", &ids).ok()) {
    const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeIds(ids, rid));
    msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
    std::vector<std::string> back;
    int64_t back_rid = 0;
    FUZZ_CHECK_OK(protocol::GetStringArray(again.get(), "ids", &back));
    FUZZ_CHECK_OK(protocol::GetInt(again.get(), "rid", &back_rid, 0));
    FUZZ_CHECK(back == ids && back_rid == rid);
  }
  protocol::Cancelled c;
  if (protocol::DecodeCancelled(oh.get(), &c).ok()) {
    const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeCancelled(c));
    msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
    protocol::Cancelled back;
    FUZZ_CHECK_OK(protocol::DecodeCancelled(again.get(), &back));
    FUZZ_CHECK(back.rid == c.rid && back.ids == c.ids && back.running == c.running &&
               back.not_found == c.not_found);
  }
  return 0;
}
