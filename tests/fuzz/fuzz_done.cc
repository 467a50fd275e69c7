// DONE bodies as the broker's backend reads them (broker/src/backend.cc, HandleBackend):
// {"ids", "duplicates"?, "not_done"?, "results"?, "notified"?, "bye"?} through GetStringArray,
// GetInt, DecodeDoneStatuses, DecodeInlineResults and DecodeDoneNotified
// (protocol/src/messages.cc). The inline result records are decoded as the SDK decodes them.
// Invariants: inline records point into the body, and EncodeDone -> decode gives the same parts.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace {

namespace protocol = ferry::protocol;

struct Done {
  std::vector<std::string> ids;
  int64_t duplicates = 0;
  protocol::DoneStatuses not_done;
  protocol::InlineResults results;
  std::vector<std::string> notified;
  bool bye = false;
};

ferry::Status Decode(const msgpack::object& body, Done* out) {
  FERRY_RETURN_IF_ERROR(protocol::GetStringArray(body, "ids", &out->ids));
  FERRY_RETURN_IF_ERROR(protocol::GetInt(body, "duplicates", &out->duplicates, 0));
  FERRY_RETURN_IF_ERROR(protocol::DecodeDoneStatuses(body, &out->not_done));
  FERRY_RETURN_IF_ERROR(protocol::DecodeInlineResults(body, &out->results));
  FERRY_RETURN_IF_ERROR(protocol::DecodeDoneNotified(body, &out->notified));
  const msgpack::object* bye = protocol::Find(body, "bye");
  out->bye = bye != nullptr && bye->type == msgpack::type::BOOLEAN && bye->via.boolean;
  return ferry::Status::Ok();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  Done done;
  if (!Decode(oh.get(), &done).ok()) return 0;
  for (const auto& [id, record] : done.results) {
    FUZZ_CHECK(id.data() >= begin && id.data() + id.size() <= begin + size);
    FUZZ_CHECK(record.empty() ||
               (record.data() >= begin && record.data() + record.size() <= begin + size));
    ferry::Result r;
    (void)protocol::DecodeResult(record.data(), record.size(), &r);
  }
  const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeDone(
      done.ids, done.duplicates, done.not_done, done.results, done.notified, done.bye));
  msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
  Done back;
  FUZZ_CHECK_OK(Decode(again.get(), &back));
  FUZZ_CHECK(back.ids == done.ids);
  FUZZ_CHECK(back.duplicates == std::max<int64_t>(done.duplicates, 0));  // only > 0 travels
  FUZZ_CHECK(back.not_done == done.not_done);
  FUZZ_CHECK(back.results == done.results);
  FUZZ_CHECK(back.notified == done.notified);
  FUZZ_CHECK(back.bye == done.bye);
  return 0;
}
