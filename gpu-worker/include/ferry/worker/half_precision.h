#pragma once
// What a model repository's `half = true` does to a module, in the worker and in
// `ferry-bench --raw --half` alike. Includes libtorch: only for translation units that already
// do.

#include <torch/script.h>

namespace ferry::worker {

// As PyTorch's Module.half(): every floating-point parameter and buffer, in every submodule,
// becomes float16; integer and bool ones (token ids, masks) stay. (torch::jit::Module::to(kHalf)
// casts them all, and a model that indexes with an int64 buffer then fails.)
inline void ToHalfPrecision(torch::jit::Module* module) {
  auto cast = [](at::Tensor t) {
    if (t.is_floating_point() && t.scalar_type() != c10::kHalf) t.set_data(t.to(c10::kHalf));
  };
  for (const at::Tensor& p : module->parameters(/*recurse=*/true)) cast(p);
  for (const at::Tensor& b : module->buffers(/*recurse=*/true)) cast(b);
}

}  // namespace ferry::worker
