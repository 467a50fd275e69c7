// Result records (the Redis value under <prefix>result:<id>, also inlined in DONE/FINISHED) as
// the SDK decodes them (producer-sdk/src/redis_store.cc and result_tracker.cc through
// protocol::DecodeResult). Invariants: a done result's outputs match their dtype and shape, and
// PackResult (the worker's encoder) -> DecodeResult gives the same result.
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace {

namespace protocol = ferry::protocol;

const char* StatusName(ferry::JobState s) {
  switch (s) {
    case ferry::JobState::kDone:
      return "done";
    case ferry::JobState::kFailed:
      return "failed";
    case ferry::JobState::kCancelled:
      return "cancelled";
    case ferry::JobState::kExpired:
      return "expired";
    default:
      return "pending";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::Result r;
  if (!protocol::DecodeResult(data, size, &r).ok()) return 0;
  FUZZ_CHECK(r.state != ferry::JobState::kPending);
  FUZZ_CHECK(r.state == ferry::JobState::kDone || r.outputs.empty());
  protocol::ResultRecord record;
  record.id = r.id;
  record.status = StatusName(r.state);
  record.model = r.model;
  record.worker = r.worker;
  for (const auto& t : r.outputs) {
    const int64_t numel = ferry::NumElements(t.shape);
    FUZZ_CHECK(numel >= 0 &&
               t.data.size() == static_cast<uint64_t>(numel) * ferry::ItemSize(t.dtype));
    protocol::TensorRef ref;
    ref.dtype = t.dtype;
    ref.shape = t.shape;
    ref.data = t.data.data();
    ref.size = t.data.size();
    record.outputs.push_back(std::move(ref));
  }
  record.error_code = r.error.code();
  record.error_message = r.error.message();
  record.batch_size = r.batch_size;
  record.attempt = r.attempt;
  record.timing_us = r.timing_us;
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  protocol::PackResult(pk, record);
  ferry::Result back;
  FUZZ_CHECK_OK(protocol::DecodeResult(buf.data(), buf.size(), &back));
  FUZZ_CHECK(back.id == r.id && back.state == r.state && back.model == r.model &&
             back.worker == r.worker && back.batch_size == r.batch_size &&
             back.attempt == r.attempt && back.timing_us == r.timing_us);
  FUZZ_CHECK(back.error.code() == r.error.code() && back.error.message() == r.error.message());
  FUZZ_CHECK(back.outputs.size() == r.outputs.size());
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    FUZZ_CHECK(back.outputs[i].dtype == r.outputs[i].dtype);
    FUZZ_CHECK(back.outputs[i].shape == r.outputs[i].shape);
    FUZZ_CHECK(back.outputs[i].data == r.outputs[i].data);
  }
  return 0;
}
