#include "npy.h"

#include <cctype>
#include <cstdint>
#include <cstring>

namespace ferry::cli {
namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);

struct Descr {
  const char* text;
  DType dtype;
};
// The names numpy writes. Single-byte types carry no byte order ('|').
constexpr Descr kDescrs[] = {
    {"<f4", DType::kFloat32}, {"<f2", DType::kFloat16}, {"<f8", DType::kFloat64},
    {"<i8", DType::kInt64},   {"<i4", DType::kInt32},   {"<i2", DType::kInt16},
    {"|i1", DType::kInt8},    {"|u1", DType::kUInt8},   {"|b1", DType::kBool},
};

Status Bad(const std::string& why) { return Status::InvalidArgument("npy: " + why); }

Status DescrToDType(std::string descr, DType* out) {
  // '<' or '=' on a one-byte type means the same as '|'.
  if (descr.size() == 3 && descr[2] == '1' && (descr[0] == '<' || descr[0] == '=')) descr[0] = '|';
  for (const auto& d : kDescrs) {
    if (descr == d.text) {
      *out = d.dtype;
      return Status::Ok();
    }
  }
  if (!descr.empty() && descr[0] == '>')
    return Bad("big-endian dtype '" + descr + "' is not supported; save with arr.astype('<" +
               descr.substr(1) + "')");
  return Bad("unsupported dtype '" + descr + "' (supported: <f4 <f2 <f8 <i8 <i4 <i2 |i1 |u1 |b1)");
}

const char* DTypeToDescr(DType dtype) {
  for (const auto& d : kDescrs) {
    if (d.dtype == dtype) return d.text;
  }
  return "<f4";  // bfloat16: written as float32
}

// A tiny reader for the Python dict literal of an .npy header:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  Status Parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    SkipSpace();
    if (!Eat('{')) return Bad("header is not a dict");
    while (true) {
      SkipSpace();
      if (Eat('}')) break;
      std::string key;
      FERRY_RETURN_IF_ERROR(String(&key));
      SkipSpace();
      if (!Eat(':')) return Bad("expected ':' after '" + key + "'");
      SkipSpace();
      if (key == "descr") {
        FERRY_RETURN_IF_ERROR(String(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        FERRY_RETURN_IF_ERROR(Bool(fortran));
        have_fortran = true;
      } else if (key == "shape") {
        FERRY_RETURN_IF_ERROR(Tuple(shape));
        have_shape = true;
      } else {
        return Bad("unexpected header key '" + key + "'");
      }
      SkipSpace();
      if (!Eat(',')) {
        SkipSpace();
        if (!Eat('}')) return Bad("expected ',' or '}' in header");
        break;
      }
    }
    if (!have_descr || !have_fortran || !have_shape)
      return Bad("header needs 'descr', 'fortran_order' and 'shape'");
    return Status::Ok();
  }

 private:
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status String(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      return Bad("expected a quoted string in header");
    char quote = s_[pos_++];
    size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return Bad("unterminated string in header");
    out->assign(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status Bool(bool* out) {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      *out = true;
    } else if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      *out = false;
    } else {
      return Bad("'fortran_order' must be True or False");
    }
    return Status::Ok();
  }
  Status Tuple(std::vector<int64_t>* out) {
    out->clear();
    if (!Eat('(')) return Bad("'shape' must be a tuple");
    while (true) {
      SkipSpace();
      if (Eat(')')) return Status::Ok();
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
        return Bad("'shape' must hold non-negative integers");
      int64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        if (v > (int64_t{1} << 40)) return Bad("shape dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 longs
      out->push_back(v);
      if (out->size() > 16) return Bad("more than 16 dimensions");
      SkipSpace();
      if (Eat(')')) return Status::Ok();
      if (!Eat(',')) return Bad("expected ',' or ')' in 'shape'");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

uint32_t ReadLE(std::string_view b, size_t pos, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint32_t{static_cast<unsigned char>(b[pos + i])} << (8 * i);
  return v;
}

}  // namespace

bool LooksLikeNpy(std::string_view bytes) { return bytes.substr(0, kMagic.size()) == kMagic; }

Status ParseNpy(std::string_view bytes, Tensor* out) {
  if (!LooksLikeNpy(bytes)) return Bad("missing the \\x93NUMPY magic");
  if (bytes.size() < 10) return Bad("file too short");
  int major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3) return Bad("unsupported format version " + std::to_string(major));
  size_t len_size = major == 1 ? 2 : 4;
  size_t header_start = 8 + len_size;
  if (bytes.size() < header_start) return Bad("file too short");
  size_t header_len = ReadLE(bytes, 8, len_size);
  if (bytes.size() < header_start + header_len) return Bad("header runs past the end of the file");
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  FERRY_RETURN_IF_ERROR(
      HeaderParser(bytes.substr(header_start, header_len)).Parse(&descr, &fortran, &shape));
  DType dtype = DType::kFloat32;
  FERRY_RETURN_IF_ERROR(DescrToDType(descr, &dtype));
  if (fortran)
    return Bad("fortran_order=True is not supported; save with np.ascontiguousarray(arr)");
  int64_t numel = NumElements(shape);
  if (numel < 0) return Bad("shape overflows");
  std::string_view data = bytes.substr(header_start + header_len);
  uint64_t want = static_cast<uint64_t>(numel) * ItemSize(dtype);
  if (data.size() != want) {
    return Bad("data has " + std::to_string(data.size()) + " bytes; dtype '" + descr +
               "' and the shape need " + std::to_string(want));
  }
  out->dtype = dtype;
  out->shape = std::move(shape);
  out->data.assign(data);
  return Status::Ok();
}

Status EncodeNpy(const Tensor& t, std::string* out) {
  int64_t numel = NumElements(t.shape);
  if (numel < 0 || t.data.size() != static_cast<uint64_t>(numel) * ItemSize(t.dtype))
    return Status::InvalidArgument("tensor data does not match its dtype and shape");
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(t.shape[i]);
  }
  if (t.shape.size() == 1) shape += ",";
  shape += ")";
  std::string header = std::string("{'descr': '") + DTypeToDescr(t.dtype) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces and end with '\n' so that the data starts on a 64-byte boundary.
  size_t len_size = header.size() + 1 + 10 > 65535 ? 4 : 2;
  size_t total = 8 + len_size + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  out->assign(kMagic);
  out->push_back(static_cast<char>(len_size == 2 ? 1 : 2));
  out->push_back('\0');
  for (size_t i = 0; i < len_size; ++i) out->push_back(static_cast<char>(header.size() >> (8 * i)));
  out->append(header);
  if (t.dtype != DType::kBFloat16) {
    out->append(t.data);
    return Status::Ok();
  }
  // bfloat16 -> float32: the bf16 bits are the high half of the float32.
  size_t base = out->size();
  out->resize(base + t.data.size() * 2);
  for (size_t i = 0; i < t.data.size() / 2; ++i) {
    uint32_t bits = uint32_t{static_cast<unsigned char>(t.data[2 * i])} << 16 |
                    uint32_t{static_cast<unsigned char>(t.data[2 * i + 1])} << 24;
    std::memcpy(&(*out)[base + 4 * i], &bits, 4);
  }
  return Status::Ok();
}

}  // namespace ferry::cli
