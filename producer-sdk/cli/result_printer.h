#pragma once
// Human-readable rendering of a ferry::Result for the `ferry` CLI.

#include <string>

#include "ferry/result.h"
#include "ferry/tensor.h"

namespace ferry::cli {

// The first `max_values` elements of `t` as text: "[0.5, 1, ...]".
std::string FormatValues(const Tensor& t, size_t max_values);

// Several lines: id, status, model, worker, batch size, attempt, timings (relative to
// "submitted"), the error or each output's dtype, shape and first values.
std::string FormatResult(const Result& r, size_t max_values = 8);

}  // namespace ferry::cli
