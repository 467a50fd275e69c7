#include "test_models.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include <ftw.h>
#include <unistd.h>

namespace ferry::worker::testmodels {
namespace {

struct Def {
  const char* source;
  std::function<void(torch::jit::Module&)> setup;
};

const std::map<std::string, Def>& Defs() {
  static const auto* defs = new std::map<std::string, Def>{
      {"double", {"def forward(self, x):\n    return x * 2.0\n", {}}},
      {"padded",
       {"def forward(self, x, lengths):\n"
        "    t = lengths * 0 + x.size(1)\n"
        "    return (x * 2.0 + 1.0, x.sum(1), lengths * 1, t)\n",
        {}}},
      {"stride2", {"def forward(self, x):\n    return x[:, ::2] * 1.0\n", {}}},
      {"identity", {"def forward(self, x):\n    return x\n", {}}},
      // Outputs past what a result may hold (protocol.md, "Tensors"): 17 dims per job, 65
      // tensors, a sparse tensor.
      {"deep",
       {"def forward(self, x):\n"
        "    return x.reshape([x.size(0), 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1])\n",
        {}}},
      {"many",
       {"def forward(self, x):\n"
        "    out = [x]\n"
        "    for i in range(64):\n"
        "        out.append(x)\n"
        "    return out\n",
        {}}},
      {"sparse", {"def forward(self, x):\n    return x.to_sparse()\n", {}}},
      {"oom",
       {"def forward(self, x):\n"
        "    assert x.size(0) <= 2, 'CUDA out of memory. Tried to allocate 2.00 GiB'\n"
        "    return x + 1.0\n",
        {}}},
      {"oom_one",  // one job (any value >= 100) too big for the device, whatever its batch
       {"def forward(self, x):\n"
        "    assert bool((x < 100.0).all()), 'CUDA out of memory. Tried to allocate 2.00 GiB'\n"
        "    return x + 1.0\n",
        {}}},
      {"oom_all",  // every job too big for the device
       {"def forward(self, x):\n"
        "    assert bool((x < -1.0e30).all()), 'CUDA out of memory. Tried to allocate 2.00 GiB'\n"
        "    return x + 1.0\n",
        {}}},
      {"methods",
       {"def embed(self, x):\n    return x * 3.0\n\ndef forward(self, x):\n    return x\n", {}}},
      {"linear64",
       {"def forward(self, x):\n    return torch.tanh(torch.matmul(x, self.w) + self.b)\n",
        [](torch::jit::Module& m) {
          torch::manual_seed(7);
          m.register_parameter("w", torch::randn({64, 64}) / 8.0, false);
          m.register_parameter("b", torch::randn({64}), false);
        }}},
      {"linear8",
       {"def forward(self, x):\n    return torch.matmul(x, self.w)\n",
        [](torch::jit::Module& m) {
          m.register_parameter("w", torch::ones({8, 3}), false);
        }}},
  };
  return *defs;
}

}  // namespace

namespace {
// Removes a file or an empty directory (nftw's callback; FTW_DEPTH: contents first).
int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

// The scratch directories; removed when destroyed, i.e. at exit (a function-local static), or
// by RemoveScratchDirs. With nftw, not std::filesystem::remove_all: on the GPU machine (GCC 13
// build, torch 2.11's process) remove_all jumped to address 0 -- the "crash at exit" of
// docs/gpu.md, seen under cuda-gdb on 2026-11-26.
struct Scratch {
  std::mutex mu;
  std::map<std::string, std::filesystem::path> dirs;
  void RemoveAll() {
    for (const auto& [prefix, dir] : dirs) nftw(dir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
    dirs.clear();
  }
  ~Scratch() { RemoveAll(); }
};
Scratch& TheScratch() {
  static Scratch scratch;
  return scratch;
}
}  // namespace

void RemoveScratchDirs() {
  Scratch& scratch = TheScratch();
  std::lock_guard<std::mutex> lock(scratch.mu);
  scratch.RemoveAll();
}

std::filesystem::path ScratchDir(const std::string& prefix) {
  Scratch& scratch = TheScratch();
  std::lock_guard<std::mutex> lock(scratch.mu);
  auto it = scratch.dirs.find(prefix);
  if (it == scratch.dirs.end()) {
    const auto dir =
        std::filesystem::path(::testing::TempDir()) / (prefix + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    it = scratch.dirs.emplace(prefix, dir).first;
  }
  return it->second;
}

std::string Path(const std::string& name) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const auto dir = ScratchDir("ferry_worker_engine_");
  const std::string path = (dir / (name + ".pt")).string();
  if (std::filesystem::exists(path)) return path;
  torch::jit::Module m("Test_" + name);
  if (name.rfind("big_", 0) == 0) {
    const float k = static_cast<float>(name.back() - 'a' + 1);
    m.register_parameter("w", torch::full({kBigBytes / 4}, k), false);
    m.define("def forward(self, x):\n    return x + self.w[0]\n");
  } else if (name == "attr_big") {  // its weight a plain tensor attribute, no parameter
    m.register_attribute("w", c10::TensorType::get(), torch::full({kBigBytes / 4}, 2.0f));
    m.define("def forward(self, x):\n    return x + self.w[0]\n");
  } else if (name == "frozen_big") {  // torch.jit.freeze: the weight a constant in the code
    m.register_parameter("w", torch::full({kBigBytes / 4}, 3.0f), false);
    m.define("def forward(self, x):\n    return x + self.w[0] + self.w[1]\n");
    m.eval();
    torch::jit::freeze(m).save(path);
    return path;
  } else {
    auto it = Defs().find(name);
    if (it == Defs().end()) {
      ADD_FAILURE() << "no test model " << name;
      return path;
    }
    if (it->second.setup) it->second.setup(m);
    m.define(it->second.source);
  }
  m.save(path);
  return path;
}

}  // namespace ferry::worker::testmodels
