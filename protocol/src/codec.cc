#include "ferry/protocol/codec.h"

#include <cstdio>
#include <cstdlib>

#include "ferry/protocol/wire.h"

namespace ferry::protocol {
namespace {

bool ReferenceAll(msgpack::type::object_type, size_t, void*) { return true; }

// Keeps hostile input from making the unpacker allocate without bound: each array element
// costs the unpacker a 24-byte object, so an array of 2^20 nils (1 MiB on the wire) cost 24 MiB
// and a 55 MiB ACCEPTED. No Ferry array needs more than 2^16 entries (jobs per SUBMIT and ids per
// CANCEL are capped below that; a worker's capacity is at most 2^16); Ferry sends no ext.
const msgpack::unpack_limit kUnpackLimits(/*array=*/1 << 16, /*map=*/kMaxMapEntries,
                                          /*str=*/1 << 20, /*bin=*/1u << 31, /*ext=*/0,
                                          /*depth=*/16);

}  // namespace

Status UnpackMap(const void* data, size_t size, msgpack::object_handle* out) {
  if (size == 0) {
    static const char kEmptyMap = '\x80';
    *out = msgpack::unpack(&kEmptyMap, 1);
    return Status::Ok();
  }
  try {
    size_t offset = 0;
    msgpack::unpack(*out, static_cast<const char*>(data), size, offset, ReferenceAll, nullptr,
                    kUnpackLimits);
    if (offset != size) return Status(codes::kMalformed, "trailing bytes after the body map");
  } catch (const std::exception& e) {
    return Status(codes::kMalformed, std::string("body is not valid msgpack: ") + e.what());
  }
  if (out->get().type != msgpack::type::MAP)
    return Status(codes::kMalformed, "body must be a msgpack map");
  return Status::Ok();
}

std::string_view AsStringView(const msgpack::object& o) {
  if (o.type == msgpack::type::STR) return {o.via.str.ptr, o.via.str.size};
  if (o.type == msgpack::type::BIN) return {o.via.bin.ptr, o.via.bin.size};
  return {};
}

const msgpack::object* Find(const msgpack::object& map, std::string_view key) {
  if (map.type != msgpack::type::MAP) return nullptr;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && AsStringView(kv.key) == key) return &kv.val;
  }
  return nullptr;
}

Status GetString(const msgpack::object& map, std::string_view key, std::string* out) {
  const msgpack::object* o = Find(map, key);
  if (!o) return Status::InvalidArgument("missing field \"" + std::string(key) + "\"");
  if (o->type != msgpack::type::STR)
    return Status::InvalidArgument("field \"" + std::string(key) + "\" must be a string");
  out->assign(o->via.str.ptr, o->via.str.size);
  return Status::Ok();
}

Status GetInt(const msgpack::object& map, std::string_view key, int64_t* out, int64_t fallback) {
  const msgpack::object* o = Find(map, key);
  if (!o || o->type == msgpack::type::NIL) {
    *out = fallback;
    return Status::Ok();
  }
  if (o->type == msgpack::type::POSITIVE_INTEGER) {
    if (o->via.u64 > static_cast<uint64_t>(INT64_MAX))
      return Status::InvalidArgument("field \"" + std::string(key) + "\" is out of range");
    *out = static_cast<int64_t>(o->via.u64);
    return Status::Ok();
  }
  if (o->type == msgpack::type::NEGATIVE_INTEGER) {
    *out = o->via.i64;
    return Status::Ok();
  }
  return Status::InvalidArgument("field \"" + std::string(key) + "\" must be an integer");
}

Status GetStringArray(const msgpack::object& map, std::string_view key,
                      std::vector<std::string>* out) {
  out->clear();
  const msgpack::object* o = Find(map, key);
  if (!o) return Status::InvalidArgument("missing field \"" + std::string(key) + "\"");
  if (o->type != msgpack::type::ARRAY)
    return Status::InvalidArgument("field \"" + std::string(key) + "\" must be an array");
  out->reserve(o->via.array.size);
  for (uint32_t i = 0; i < o->via.array.size; ++i) {
    const auto& e = o->via.array.ptr[i];
    if (e.type != msgpack::type::STR)
      return Status::InvalidArgument("field \"" + std::string(key) + "\" must hold strings");
    out->emplace_back(e.via.str.ptr, e.via.str.size);
  }
  return Status::Ok();
}

Status DecodeTensor(const msgpack::object& o, TensorRef* out, bool allow_stored) {
  if (o.type != msgpack::type::MAP) return Status::InvalidArgument("a tensor must be a map");
  const msgpack::object* dtype = Find(o, "dtype");
  if (!dtype || dtype->type != msgpack::type::STR)
    return Status::InvalidArgument("tensor \"dtype\" must be a string");
  if (!ParseDType(AsStringView(*dtype), &out->dtype))
    return Status::InvalidArgument("unknown dtype \"" + std::string(AsStringView(*dtype)) + "\"");
  const msgpack::object* shape = Find(o, "shape");
  if (!shape || shape->type != msgpack::type::ARRAY)
    return Status::InvalidArgument("tensor \"shape\" must be an array of integers");
  if (shape->via.array.size > kMaxTensorDims)
    return Status::InvalidArgument("tensor has more than 16 dimensions");
  out->shape.clear();
  for (uint32_t i = 0; i < shape->via.array.size; ++i) {
    const auto& d = shape->via.array.ptr[i];
    if (d.type != msgpack::type::POSITIVE_INTEGER || d.via.u64 > (uint64_t{1} << 40))
      return Status::InvalidArgument("tensor shape dims must be non-negative integers");
    out->shape.push_back(static_cast<int64_t>(d.via.u64));
  }
  int64_t numel = NumElements(out->shape);
  if (numel < 0) return Status::InvalidArgument("tensor shape overflows");
  uint64_t want = static_cast<uint64_t>(numel) * ItemSize(out->dtype);
  const msgpack::object* data = Find(o, "data");
  const msgpack::object* stored = Find(o, "stored");
  const msgpack::object* attached = Find(o, "attached");
  out->stored = false;
  out->attached = false;
  if (allow_stored && attached != nullptr) {
    if (attached->type != msgpack::type::BOOLEAN || !attached->via.boolean)
      return Status::InvalidArgument("tensor \"attached\" must be true (or left out)");
    if (data != nullptr || stored != nullptr)
      return Status::InvalidArgument("an attached tensor has no \"data\" and no \"stored\"");
    out->attached = true;
    out->data = nullptr;
    out->size = want;
    return Status::Ok();
  }
  if (allow_stored && stored != nullptr) {
    if (stored->type != msgpack::type::BOOLEAN || !stored->via.boolean)
      return Status::InvalidArgument("tensor \"stored\" must be true (or left out)");
    if (data != nullptr) return Status::InvalidArgument("a stored tensor has no \"data\"");
    out->stored = true;
    out->data = nullptr;
    out->size = want;
    return Status::Ok();
  }
  if (!data || data->type != msgpack::type::BIN)
    return Status::InvalidArgument("tensor \"data\" must be msgpack bin");
  if (data->via.bin.size != want) {
    return Status::InvalidArgument("tensor data has " + std::to_string(data->via.bin.size) +
                                   " bytes; dtype and shape need " + std::to_string(want));
  }
  out->data = data->via.bin.ptr;
  out->size = data->via.bin.size;
  return Status::Ok();
}

Status DecodeTensorList(const msgpack::object& o, std::vector<TensorRef>* out, bool allow_stored) {
  if (o.type != msgpack::type::ARRAY) return Status::InvalidArgument("tensors must be an array");
  if (o.via.array.size > kMaxInputsPerJob)
    return Status::InvalidArgument("more than 64 tensors in one job");
  out->resize(o.via.array.size);
  // Each tensor is at most 2^62 bytes (NumElements); their sum must not wrap either: stored
  // inputs claim sizes they do not carry, and two of 2^62 summed to a negative job size that
  // admission let through (found by tests/fuzz/fuzz_submit).
  constexpr uint64_t kMaxTotalBytes = uint64_t{1} << 62;
  uint64_t total = 0;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    Status s = DecodeTensor(o.via.array.ptr[i], &(*out)[i], allow_stored);
    if (!s.ok()) return Status(s.code(), "tensor " + std::to_string(i) + ": " + s.message());
    if ((*out)[i].size > kMaxTotalBytes - total)
      return Status::InvalidArgument("the tensors of one job are over 2^62 bytes");
    total += (*out)[i].size;
  }
  return Status::Ok();
}

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape, const void* data,
                size_t size) {
  pk.pack_map(3);
  PackString(pk, "dtype");
  PackString(pk, DTypeName(dtype));
  PackString(pk, "shape");
  pk.pack_array(static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) pk.pack_int64(d);
  PackString(pk, "data");
  pk.pack_bin(static_cast<uint32_t>(size));
  pk.pack_bin_body(static_cast<const char*>(data), static_cast<uint32_t>(size));
}

namespace {
// {"dtype", "shape", KEY: true}: a job input whose bytes travel elsewhere (Redis, a data frame).
void PackTensorWithout(Packer& pk, DType dtype, const std::vector<int64_t>& shape,
                       std::string_view key) {
  pk.pack_map(3);
  PackString(pk, "dtype");
  PackString(pk, DTypeName(dtype));
  PackString(pk, "shape");
  pk.pack_array(static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) pk.pack_int64(d);
  PackString(pk, key);
  pk.pack_true();
}
}  // namespace

void PackStoredTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape) {
  PackTensorWithout(pk, dtype, shape, "stored");
}

void PackAttachedTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape) {
  PackTensorWithout(pk, dtype, shape, "attached");
}

bool IsAttached(const msgpack::object& o) {
  if (o.type != msgpack::type::MAP) return false;
  const msgpack::object* a = Find(o, "attached");
  return a != nullptr && a->type == msgpack::type::BOOLEAN && a->via.boolean;
}

size_t AttachedInJob(const msgpack::object& job) {
  if (job.type != msgpack::type::MAP) return 0;
  const msgpack::object* inputs = Find(job, "inputs");
  if (!inputs || inputs->type != msgpack::type::ARRAY) return 0;
  size_t n = 0;
  for (uint32_t k = 0; k < inputs->via.array.size; ++k) n += IsAttached(inputs->via.array.ptr[k]);
  return n;
}

size_t AttachedCount(const msgpack::object& jobs) {
  if (jobs.type != msgpack::type::ARRAY) return 0;
  size_t n = 0;
  for (uint32_t i = 0; i < jobs.via.array.size; ++i) n += AttachedInJob(jobs.via.array.ptr[i]);
  return n;
}

Tensor ToTensor(const TensorRef& ref) {
  Tensor t;
  t.dtype = ref.dtype;
  t.shape = ref.shape;
  t.data.assign(ref.data, ref.size);
  return t;
}

void PackIntMap(Packer& pk, const std::map<std::string, int64_t>& m) {
  pk.pack_map(static_cast<uint32_t>(m.size()));
  for (const auto& [k, v] : m) {
    PackString(pk, k);
    pk.pack_int64(v);
  }
}

}  // namespace ferry::protocol

namespace ferry::protocol {
namespace {
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendJson(std::string* out, const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      out->append("null");
      break;
    case msgpack::type::BOOLEAN:
      out->append(o.via.boolean ? "true" : "false");
      break;
    case msgpack::type::POSITIVE_INTEGER:
      out->append(std::to_string(o.via.u64));
      break;
    case msgpack::type::NEGATIVE_INTEGER:
      out->append(std::to_string(o.via.i64));
      break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.6g", o.via.f64);
      out->append(buf);
      break;
    }
    case msgpack::type::STR:
      AppendJsonString(out, AsStringView(o));
      break;
    case msgpack::type::BIN:
      out->append("{\"bin\":" + std::to_string(o.via.bin.size) + "}");
      break;
    case msgpack::type::ARRAY:
      out->push_back('[');
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        if (i) out->push_back(',');
        AppendJson(out, o.via.array.ptr[i]);
      }
      out->push_back(']');
      break;
    case msgpack::type::MAP:
      out->push_back('{');
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        if (i) out->push_back(',');
        const auto& kv = o.via.map.ptr[i];
        if (kv.key.type == msgpack::type::STR)
          AppendJsonString(out, AsStringView(kv.key));
        else {
          std::string k;
          AppendJson(&k, kv.key);
          AppendJsonString(out, k);
        }
        out->push_back(':');
        AppendJson(out, kv.val);
      }
      out->push_back('}');
      break;
    default:
      out->append("null");
  }
}
}  // namespace

std::string ToJson(const msgpack::object& o) {
  std::string out;
  AppendJson(&out, o);
  return out;
}
}  // namespace ferry::protocol
