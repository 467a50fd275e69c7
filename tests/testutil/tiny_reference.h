#pragma once
// The `tiny` model of ferry-make-models, computed by hand for tests that link no libtorch:
// y[j] = sum_i x[i] * W[i][j] + b[j], W[i][j] = 0.01*(i*8+j) - 0.3, b[j] = 0.1*j.

#include <cstdint>
#include <vector>

namespace ferry::testutil {

// A deterministic [8] input for job number `seed`, values in [-1, 1).
inline std::vector<float> TinyInput(uint32_t seed) {
  std::vector<float> x(8);
  for (int i = 0; i < 8; ++i) x[i] = static_cast<float>((seed * 31 + i * 7) % 97) / 50.0f - 1.0f;
  return x;
}

// What tiny.pt returns for `x`.
inline std::vector<float> TinyExpected(const std::vector<float>& x) {
  std::vector<float> y(8);
  for (int j = 0; j < 8; ++j) {
    double acc = 0.1 * j;
    for (int i = 0; i < 8; ++i) acc += x[i] * (0.01 * (i * 8 + j) - 0.3);
    y[j] = static_cast<float>(acc);
  }
  return y;
}

}  // namespace ferry::testutil
