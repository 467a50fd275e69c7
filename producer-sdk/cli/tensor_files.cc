#include "tensor_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ferry/protocol/redis_errors.h"
#include "npy.h"

namespace ferry::cli {

Status ParseShape(std::string_view text, std::vector<int64_t>* out) {
  out->clear();
  std::string cleaned;
  for (char c : text) {
    if (c == '[' || c == ']' || c == '(' || c == ')' || c == ' ') continue;
    cleaned.push_back(c == 'x' ? ',' : c);
  }
  if (cleaned.empty()) return Status::Ok();
  std::stringstream ss(cleaned);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() && ss.eof()) break;  // trailing comma
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (...) {
      used = 0;
    }
    if (used != part.size() || v < 0)
      return Status::InvalidArgument("bad shape \"" + std::string(text) +
                                     "\": want non-negative integers like 1,8");
    out->push_back(v);
  }
  return Status::Ok();
}

Status ReadFile(const std::string& path, std::string* out) {
  // A regular file of at most what one input can be (a stored input is one Redis value): not a
  // directory (read as empty), nor /dev/zero or a file too big to send (read whole first).
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) return Status::InvalidArgument("cannot open \"" + path + "\": " + ec.message());
  if (!std::filesystem::is_regular_file(status))
    return Status::InvalidArgument("\"" + path + "\" is not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::InvalidArgument("cannot read \"" + path + "\": " + ec.message());
  if (size > protocol::kMaxValueDataBytes + 4096)  // + an .npy header
    return Status::InvalidArgument("\"" + path + "\" has " + std::to_string(size) +
                                   " bytes; an input takes at most " +
                                   std::to_string(protocol::kMaxValueDataBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument("cannot open \"" + path + "\"");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::InvalidArgument("cannot read \"" + path + "\"");
  *out = std::move(ss).str();
  return Status::Ok();
}

Status WriteFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return Status::Internal("cannot write \"" + path + "\"");
  return Status::Ok();
}

Status ReadTensorFile(const std::string& path, const std::string& dtype, const std::string& shape,
                      Tensor* out) {
  std::string bytes;
  FERRY_RETURN_IF_ERROR(ReadFile(path, &bytes));
  if (LooksLikeNpy(bytes)) {
    Status s = ParseNpy(bytes, out);
    if (!s.ok()) return Status(s.code(), path + ": " + s.message());
    return Status::Ok();
  }
  if (!ParseDType(dtype, &out->dtype))
    return Status::InvalidArgument("unknown --dtype \"" + dtype + "\"");
  size_t item = ItemSize(out->dtype);
  if (shape.empty()) {
    if (bytes.size() % item != 0) {
      return Status::InvalidArgument(path + ": " + std::to_string(bytes.size()) +
                                     " bytes is not a whole number of " + dtype + " values");
    }
    out->shape = {static_cast<int64_t>(bytes.size() / item)};
  } else {
    FERRY_RETURN_IF_ERROR(ParseShape(shape, &out->shape));
    int64_t numel = NumElements(out->shape);
    if (numel < 0 || bytes.size() != static_cast<uint64_t>(numel) * item) {
      return Status::InvalidArgument(path + ": " + std::to_string(bytes.size()) + " bytes, but " +
                                     dtype + " with shape " + shape + " needs " +
                                     std::to_string(numel < 0 ? 0 : numel * item));
    }
  }
  out->data = std::move(bytes);
  return Status::Ok();
}

}  // namespace ferry::cli
