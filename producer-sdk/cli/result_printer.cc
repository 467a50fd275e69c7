#include "result_printer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

namespace ferry::cli {
namespace {

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = uint32_t{b} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

template <typename T>
T Load(const std::string& data, size_t i) {
  T v;
  std::memcpy(&v, data.data() + i * sizeof(T), sizeof(T));
  return v;
}

void AppendValue(std::ostringstream& os, const Tensor& t, size_t i) {
  switch (t.dtype) {
    case DType::kFloat32:
      os << Load<float>(t.data, i);
      break;
    case DType::kFloat64:
      os << Load<double>(t.data, i);
      break;
    case DType::kFloat16:
      os << HalfToFloat(Load<uint16_t>(t.data, i));
      break;
    case DType::kBFloat16:
      os << BFloat16ToFloat(Load<uint16_t>(t.data, i));
      break;
    case DType::kInt64:
      os << Load<int64_t>(t.data, i);
      break;
    case DType::kInt32:
      os << Load<int32_t>(t.data, i);
      break;
    case DType::kInt16:
      os << Load<int16_t>(t.data, i);
      break;
    case DType::kInt8:
      os << static_cast<int>(Load<int8_t>(t.data, i));
      break;
    case DType::kUInt8:
      os << static_cast<int>(Load<uint8_t>(t.data, i));
      break;
    case DType::kBool:
      os << (Load<uint8_t>(t.data, i) ? "true" : "false");
      break;
  }
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string FormatValues(const Tensor& t, size_t max_values) {
  size_t n = t.data.size() / ItemSize(t.dtype);
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < std::min(n, max_values); ++i) {
    if (i) os << ", ";
    AppendValue(os, t, i);
  }
  if (n > max_values) os << ", ... (" << n << " values)";
  os << "]";
  return os.str();
}

std::string FormatResult(const Result& r, size_t max_values) {
  std::ostringstream os;
  os << "id:          " << r.id << "\n";
  os << "status:      " << JobStateName(r.state) << "\n";
  if (r.state == JobState::kPending) return os.str();
  os << "model:       " << r.model << "\n";
  os << "worker:      " << (r.worker.empty() ? "-" : r.worker) << "\n";
  os << "batch_size:  " << r.batch_size << "\n";
  os << "attempt:     " << r.attempt << "\n";
  if (!r.timing_us.empty()) {
    std::vector<std::pair<std::string, int64_t>> t(r.timing_us.begin(), r.timing_us.end());
    std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    auto sub = r.timing_us.find("submitted");
    int64_t base = sub != r.timing_us.end() ? sub->second : t.front().second;
    os << "timing_us:  ";
    for (const auto& [name, us] : t) os << " " << name << "=+" << (us - base);
    os << "  (relative to submitted)\n";
  }
  if (!r.error.ok()) os << "error:       " << r.error.ToString() << "\n";
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const Tensor& o = r.outputs[i];
    os << "output " << i << ":    " << DTypeName(o.dtype) << " " << FormatShape(o.shape) << " "
       << FormatValues(o, max_values) << "\n";
  }
  return os.str();
}

}  // namespace ferry::cli
