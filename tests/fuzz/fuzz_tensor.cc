// Tensors as every message body carries them: {"dtype", "shape", "data": bin}, and the stored
// and attached forms {"dtype", "shape", "stored" / "attached": true} of job inputs
// (protocol/src/codec.cc); a decoded tensor is attached exactly when IsAttached says so. The input
// is one msgpack map: a tensor, or a map holding "inputs": [tensor, ...] (a job's input list).
// Invariants: size = numel * itemsize, the bytes point into the input (no copy), and
// decode -> encode -> decode gives the same tensor.
#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "fuzz_wire.h"

namespace {

using ferry::protocol::TensorRef;

void RoundTrip(const TensorRef& t) {
  msgpack::sbuffer buf;
  ferry::protocol::Packer pk(buf);
  pk.pack_map(1);
  ferry::protocol::PackString(pk, "t");
  if (t.stored)
    ferry::protocol::PackStoredTensor(pk, t.dtype, t.shape);
  else if (t.attached)
    ferry::protocol::PackAttachedTensor(pk, t.dtype, t.shape);
  else
    ferry::protocol::PackTensor(pk, t);
  const std::string bytes = ferry::fuzz::Bytes(buf);
  msgpack::object_handle oh = ferry::fuzz::MustUnpack(bytes);
  TensorRef back;
  FUZZ_CHECK_OK(ferry::protocol::DecodeTensor(*ferry::protocol::Find(oh.get(), "t"), &back,
                                              /*allow_stored=*/true));
  FUZZ_CHECK(ferry::fuzz::SameTensor(t, back));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* begin = reinterpret_cast<const char*>(data);
  msgpack::object_handle oh;
  if (!ferry::protocol::UnpackMap(data, size, &oh).ok()) return 0;
  for (bool allow_stored : {false, true}) {
    TensorRef t;
    if (ferry::protocol::DecodeTensor(oh.get(), &t, allow_stored).ok()) {
      FUZZ_CHECK(allow_stored || (!t.stored && !t.attached));
      FUZZ_CHECK(!allow_stored || t.attached == ferry::protocol::IsAttached(oh.get()));
      ferry::fuzz::CheckTensor(t, begin, size);
      RoundTrip(t);
    }
    if (const msgpack::object* list = ferry::protocol::Find(oh.get(), "inputs")) {
      std::vector<TensorRef> tensors;
      if (ferry::protocol::DecodeTensorList(*list, &tensors, allow_stored).ok()) {
        FUZZ_CHECK(tensors.size() <= ferry::protocol::kMaxInputsPerJob);
        for (const auto& e : tensors) {
          FUZZ_CHECK(allow_stored || (!e.stored && !e.attached));
          ferry::fuzz::CheckTensor(e, begin, size);
          RoundTrip(e);
        }
        const std::vector<int32_t> stored = ferry::protocol::StoredInputs(tensors);
        for (int32_t i : stored) FUZZ_CHECK(tensors.at(static_cast<size_t>(i)).stored);
      }
    }
  }
  return 0;
}
