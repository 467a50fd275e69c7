#pragma once
// What the codec tests share (codec_tensor_test.cc, codec_submit_test.cc, codec_result_test.cc):
// a packed body unpacked as one msgpack map, failing the test when it is not one.

#include <gtest/gtest.h>

#include "ferry/protocol/codec.h"

namespace ferry::protocol::codec_test {

inline msgpack::object_handle Unpacked(const msgpack::sbuffer& buf) {
  msgpack::object_handle oh;
  Status s = UnpackMap(buf.data(), buf.size(), &oh);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return oh;
}

}  // namespace ferry::protocol::codec_test
