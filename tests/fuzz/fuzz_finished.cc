// FINISHED {"ids", "results"?: {id: record}} as the SDK's I/O thread reads it
// (producer-sdk/src/io_thread.cc, DeliverFinished) -- from the broker, or as a worker's result
// notice on the producer's Pub/Sub channel -- and each inline record as the ResultTracker decodes
// it (protocol::DecodeResult). Invariants: EncodeFinished -> decode gives the same ids and
// records.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace protocol = ferry::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msgpack::object_handle oh;
  if (!protocol::UnpackMap(data, size, &oh).ok()) return 0;
  std::vector<std::string> ids;
  protocol::InlineResults records;
  if (!protocol::DecodeInlineResults(oh.get(), &records).ok()) records.clear();
  if (!protocol::GetStringArray(oh.get(), "ids", &ids).ok()) return 0;
  for (const auto& [id, record] : records) {
    ferry::Result r;
    (void)protocol::DecodeResult(record.data(), record.size(), &r);
  }
  const std::string bytes = ferry::fuzz::Bytes(protocol::EncodeFinished(ids, records));
  msgpack::object_handle again = ferry::fuzz::MustUnpack(bytes);
  std::vector<std::string> back_ids;
  protocol::InlineResults back_records;
  FUZZ_CHECK_OK(protocol::GetStringArray(again.get(), "ids", &back_ids));
  FUZZ_CHECK_OK(protocol::DecodeInlineResults(again.get(), &back_records));
  FUZZ_CHECK(back_ids == ids && back_records == records);
  return 0;
}
