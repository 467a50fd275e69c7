#pragma once
// msgpack helpers shared by every message body: safe unpacking with limits, typed field access
// that reports which field is wrong, and tensor encoding ({"dtype", "shape", "data"}).
//
// Bodies are unpacked in *reference* mode: strings and binaries in the resulting objects point
// into the received buffer, which must outlive the object_handle. Nothing here throws.

#include <cstdint>
#include <map>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/protocol/types.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::protocol {

using Packer = msgpack::packer<msgpack::sbuffer>;

// Unpacks a body that must be one msgpack map (an empty buffer is an empty map).
// Returns kMalformed on anything else.
Status UnpackMap(const void* data, size_t size, msgpack::object_handle* out);

// Field access on a msgpack map. Find returns nullptr when absent.
const msgpack::object* Find(const msgpack::object& map, std::string_view key);
std::string_view AsStringView(const msgpack::object& o);  // STR or BIN; empty otherwise
Status GetString(const msgpack::object& map, std::string_view key, std::string* out);
Status GetInt(const msgpack::object& map, std::string_view key, int64_t* out, int64_t fallback);
Status GetStringArray(const msgpack::object& map, std::string_view key,
                      std::vector<std::string>* out);

// Tensors: decoding validates dtype, shape and that data is exactly numel * itemsize bytes.
// With `allow_stored` (job inputs), {"dtype", "shape", "stored": true} is a stored input: no
// data here, the bytes are in Redis, and {"dtype", "shape", "attached": true} an attached one:
// its bytes are a frame of the message (see TensorRef). A job input has one of "data",
// "stored": true and "attached": true; anything else is invalid_argument.
Status DecodeTensor(const msgpack::object& o, TensorRef* out, bool allow_stored = false);
Status DecodeTensorList(const msgpack::object& o, std::vector<TensorRef>* out,
                        bool allow_stored = false);
// {"dtype", "shape", "stored": true}: a job input whose bytes the producer put in Redis.
void PackStoredTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape);
// {"dtype", "shape", "attached": true}: a job input whose bytes travel in a frame of their own.
void PackAttachedTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape);
// True when `o` is a tensor map marked "attached": true -- the test that matches a message's
// data frames to its tensors, applied whether or not the rest of the tensor is valid.
bool IsAttached(const msgpack::object& o);
// How many tensors of one job map (SUBMIT job or CHUNK entry) are marked attached, valid or
// not, when its "inputs" is an array: the job's share of the message's data frames, in order.
size_t AttachedInJob(const msgpack::object& job);
// The sum of AttachedInJob over a "jobs" array: the number of data frames the message carries.
size_t AttachedCount(const msgpack::object& jobs);
void PackTensor(Packer& pk, DType dtype, const std::vector<int64_t>& shape, const void* data,
                size_t size);
inline void PackTensor(Packer& pk, const Tensor& t) {
  PackTensor(pk, t.dtype, t.shape, t.data.data(), t.data.size());
}
inline void PackTensor(Packer& pk, const TensorRef& t) {
  PackTensor(pk, t.dtype, t.shape, t.data, t.size);
}
Tensor ToTensor(const TensorRef& ref);  // copies the bytes

void PackString(Packer& pk, std::string_view s);

// Packs a string->int map (timings, counters).
void PackIntMap(Packer& pk, const std::map<std::string, int64_t>& m);

}  // namespace ferry::protocol

namespace ferry::protocol {
// Renders any msgpack object as JSON text (bin as {"bin": N bytes}); for CLIs and logs.
std::string ToJson(const msgpack::object& o);
}  // namespace ferry::protocol
