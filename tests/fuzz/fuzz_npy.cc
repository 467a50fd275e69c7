// .npy files as the `ferry` CLI reads them (producer-sdk/cli/npy.cc, ParseNpy: `ferry submit
// --input x.npy`). Invariants: the data is exactly numel * itemsize bytes, and EncodeNpy ->
// ParseNpy gives the same tensor.
#include <cstdint>

#include "fuzz_check.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ferry::Tensor t;
  if (!ferry::cli::ParseNpy(bytes, &t).ok()) return 0;
  const int64_t numel = ferry::NumElements(t.shape);
  FUZZ_CHECK(numel >= 0);
  FUZZ_CHECK(static_cast<uint64_t>(numel) <=
             static_cast<uint64_t>(INT64_MAX) / ferry::ItemSize(t.dtype));
  FUZZ_CHECK(t.data.size() == static_cast<uint64_t>(numel) * ferry::ItemSize(t.dtype));
  std::string encoded;
  FUZZ_CHECK_OK(ferry::cli::EncodeNpy(t, &encoded));
  ferry::Tensor back;
  FUZZ_CHECK_OK(ferry::cli::ParseNpy(encoded, &back));
  FUZZ_CHECK(back.dtype == t.dtype && back.shape == t.shape && back.data == t.data);
  return 0;
}
