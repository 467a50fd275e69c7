#include "ferry/protocol/wire.h"

namespace ferry::protocol {

Status RecvMessage(zmq::socket_t& socket, bool router, Message* out, bool dont_wait) {
  out->envelope.clear();
  out->command.clear();
  out->body.rebuild();
  std::vector<zmq::message_t> parts;
  try {
    while (true) {
      zmq::message_t part;
      auto got = socket.recv(part, parts.empty() && dont_wait ? zmq::recv_flags::dontwait
                                                               : zmq::recv_flags::none);
      if (!got) return Status::Unavailable("no message");
      bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("recv: ") + e.what());
  }
  size_t tag = parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].to_string_view() == kTag) { tag = i; break; }
  }
  if (tag == parts.size() || (router && tag == 0)) {
    if (router && !parts.empty()) out->envelope.push_back(std::move(parts[0]));
    return Status(codes::kMalformed, "message has no FERRY1 tag frame");
  }
  for (size_t i = 0; i < tag; ++i) out->envelope.push_back(std::move(parts[i]));
  if (parts.size() - tag < 2 || parts.size() - tag > 3)
    return Status(codes::kMalformed, "expected FERRY1, COMMAND and BODY frames");
  out->command = std::string(parts[tag + 1].to_string_view());
  if (parts.size() - tag == 3) out->body = std::move(parts[tag + 2]);
  if (out->command.empty() || out->command.size() > 32)
    return Status(codes::kMalformed, "bad command frame");
  for (char c : out->command) {
    if (c < 'A' || c > 'Z') return Status(codes::kMalformed, "command must be upper-case ASCII");
  }
  return Status::Ok();
}

Status SendMessage(zmq::socket_t& socket, const std::vector<zmq::message_t>* envelope,
                   std::string_view command, zmq::message_t body) {
  try {
    if (envelope) {
      for (const auto& frame : *envelope) {
        zmq::message_t copy(frame.data(), frame.size());
        if (!socket.send(copy, zmq::send_flags::sndmore))
          return Status::Unavailable("send would block");
      }
    }
    // cppzmq returns an empty optional when the send would block (SNDTIMEO/HWM): report it.
    if (!socket.send(zmq::buffer(kTag), zmq::send_flags::sndmore) ||
        !socket.send(zmq::buffer(command), zmq::send_flags::sndmore) ||
        !socket.send(body, zmq::send_flags::none))
      return Status::Unavailable("send would block");
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("send: ") + e.what());
  }
  return Status::Ok();
}

Status SendTo(zmq::socket_t& socket, std::string_view routing_id, std::string_view command,
              zmq::message_t body) {
  try {
    if (!socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore))
      return Status::Unavailable("send would block");
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("send: ") + e.what());
  }
  return SendMessage(socket, nullptr, command, std::move(body));
}

}  // namespace ferry::protocol
