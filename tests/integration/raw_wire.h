#pragma once
// Speaking the wire protocol by hand over a raw DEALER, as a client (or a worker) in another
// language does (docs/protocol.md): for wire_test.cc and wire_limits_test.cc.

#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/protocol/codec.h"
#include "ferry/protocol/messages.h"
#include "ferry/protocol/wire.h"
#include "ferry/tensor.h"

namespace ferry::testutil {

// A DEALER connected to `endpoint`, for speaking the wire protocol by hand.
inline zmq::socket_t RawDealer(zmq::context_t& ctx, const std::string& endpoint, int rcvtimeo_ms) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, rcvtimeo_ms);
  s.connect(endpoint);
  return s;
}

// Sends raw frames over a DEALER as one message.
inline void RawSend(zmq::socket_t& s, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]),
           i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

// Sends raw frames over a DEALER and returns the reply's command ("" when none within its
// receive timeout), skipping FINISHED notices as a client does.
inline std::string RawExchange(zmq::socket_t& s, const std::vector<std::string>& frames,
                               std::string* code = nullptr) {
  RawSend(s, frames);
  protocol::Message m;
  do {
    if (!protocol::RecvMessage(s, false, &m, /*dont_wait=*/false).ok()) return "";
  } while (m.command == protocol::kFinished);
  if (code) {
    msgpack::object_handle oh;
    if (protocol::UnpackMap(m.body.data(), m.body.size(), &oh).ok())
      protocol::GetString(oh.get(), "code", code);
  }
  return m.command;
}

// The body of a SUBMIT of one job per id, of `model`, with `t` as its one input, attached (its
// bytes are to follow as a data frame per job).
inline std::string AttachedSubmitBody(const std::vector<std::string>& ids, const std::string& model,
                                      const Tensor& t) {
  msgpack::sbuffer buf;
  protocol::Packer pk(buf);
  pk.pack_map(1);
  protocol::PackString(pk, "jobs");
  pk.pack_array(static_cast<uint32_t>(ids.size()));
  for (const auto& id : ids) protocol::PackSubmitJob(pk, id, model, {t}, 0, 0, 0, {}, {true});
  return std::string(buf.data(), buf.size());
}

// The body of a READY of worker `name` serving `model` (max batch 1) with `capacity`.
inline std::string ReadyBody(const std::string& name, const std::string& model,
                             int64_t capacity = 1) {
  protocol::WorkerHello hello;
  hello.worker = name;
  hello.device = "cpu";
  hello.host = "h";
  hello.pid = 1;
  hello.capacity = capacity;
  hello.models = {{model, 1, std::nullopt}};
  const zmq::message_t m = protocol::EncodeHello(hello);
  return std::string(static_cast<const char*>(m.data()), m.size());
}

}  // namespace ferry::testutil
