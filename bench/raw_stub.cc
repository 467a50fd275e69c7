// Stands in for raw_runner.cc when the build has no libtorch: --raw reports that it is missing.
#include "raw_runner.h"

namespace ferry::bench {

bool RawAvailable() { return false; }
std::string TorchInfo() { return ""; }

Status RunRaw(const RawOptions&, std::vector<Sample>* samples, int64_t* jobs_done,
              double* seconds) {
  samples->clear();
  *jobs_done = 0;
  *seconds = 0;
  return Status::InvalidArgument("this ferry-bench was built without libtorch: no --raw mode");
}

}  // namespace ferry::bench
