// The worker's model repository file (`ferry-worker --models FILE`: TOML through toml++,
// gpu-worker/src/model_config.cc, ParseModelRepositoryText). model_config.cc is torch-free and is
// compiled into this target alone, against the toml++ library the worker links (the worker
// library links libtorch; see CMakeLists.txt here for why toml++ is not header-only). Invariants:
// every entry it returns passes ValidateModelConfig and has a unique name.
#include <set>
#include <string>
#include <vector>

#include "ferry/worker/model_config.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<ferry::worker::ModelConfig> models;
  if (!ferry::worker::ParseModelRepositoryText(text, "fuzz.toml", &models).ok()) return 0;
  FUZZ_CHECK(!models.empty());
  std::set<std::string> names;
  for (const auto& m : models) {
    FUZZ_CHECK_OK(ferry::worker::ValidateModelConfig(m));
    FUZZ_CHECK(names.insert(m.name).second);
  }
  return 0;
}
