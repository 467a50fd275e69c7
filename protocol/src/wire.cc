#include "ferry/protocol/wire.h"

#include <poll.h>

#include <cerrno>
#include <cstdlib>

namespace ferry::protocol {

namespace {
constexpr size_t kCopyBelowBytes = 4096;
}  // namespace

zmq::message_t ToMessage(msgpack::sbuffer&& buffer) {
  size_t size = buffer.size();
  if (size == 0) return zmq::message_t();
  // A small body is copied into a message of its exact size: handing over the buffer would keep
  // its whole capacity (8 KiB at least) alive for as long as the message waits in a queue.
  if (size <= kCopyBelowBytes) return zmq::message_t(buffer.data(), size);
  char* data = buffer.release();
  return zmq::message_t(
      data, size, [](void* d, void*) { std::free(d); }, nullptr);
}

Status MatchFrames(std::vector<TensorRef>* inputs, const zmq::message_t* frames, size_t n) {
  size_t next = 0;
  for (size_t k = 0; k < inputs->size(); ++k) {
    TensorRef& t = (*inputs)[k];
    if (!t.attached) continue;
    if (next >= n)
      return Status::InvalidArgument("tensor " + std::to_string(k) + ": no data frame");
    const zmq::message_t& f = frames[next++];
    if (f.size() != t.size) {
      return Status::InvalidArgument("tensor " + std::to_string(k) + ": its data frame has " +
                                     std::to_string(f.size()) + " bytes; dtype and shape need " +
                                     std::to_string(t.size));
    }
    t.data = static_cast<const char*>(f.data());
  }
  return Status::Ok();
}

int PollSockets(zmq_pollitem_t* items, int n, long timeout_ms) {
  constexpr int kMaxItems = 8;
  if (n < 0 || n > kMaxItems) {
    errno = EINVAL;
    return -1;
  }
  // A ZeroMQ socket's readiness, from ZMQ_EVENTS (which also processes its pending commands).
  auto socket_events = [](zmq_pollitem_t& item) {
    uint32_t events = 0;
    size_t size = sizeof(events);
    if (zmq_getsockopt(item.socket, ZMQ_EVENTS, &events, &size) != 0) return false;
    item.revents = static_cast<short>(events & item.events & (ZMQ_POLLIN | ZMQ_POLLOUT));
    return true;
  };
  int ready = 0;
  for (int i = 0; i < n; ++i) {
    items[i].revents = 0;
    if (!items[i].socket) continue;
    if (!socket_events(items[i])) return -1;
    if (items[i].revents) ++ready;
  }
  if (ready > 0 || timeout_ms == 0) return ready;

  pollfd fds[kMaxItems];
  for (int i = 0; i < n; ++i) {
    if (items[i].socket) {
      size_t size = sizeof(fds[i].fd);
      if (zmq_getsockopt(items[i].socket, ZMQ_FD, &fds[i].fd, &size) != 0) return -1;
      fds[i].events = POLLIN;  // the socket's notification fd: "its state may have changed"
    } else {
      fds[i].fd = items[i].fd;
      fds[i].events = static_cast<short>(((items[i].events & ZMQ_POLLIN) ? POLLIN : 0) |
                                         ((items[i].events & ZMQ_POLLOUT) ? POLLOUT : 0));
    }
    fds[i].revents = 0;
  }
  const int rc =
      poll(fds, static_cast<nfds_t>(n), timeout_ms < 0 ? -1 : static_cast<int>(timeout_ms));
  if (rc <= 0) return rc;  // timeout, or -1 with errno (EINTR)
  for (int i = 0; i < n; ++i) {
    if (!fds[i].revents) continue;
    if (items[i].socket) {
      if (!socket_events(items[i])) return -1;
    } else {
      items[i].revents =
          static_cast<short>(((fds[i].revents & POLLIN) ? ZMQ_POLLIN : 0) |
                             ((fds[i].revents & POLLOUT) ? ZMQ_POLLOUT : 0) |
                             ((fds[i].revents & (POLLERR | POLLHUP)) ? ZMQ_POLLERR : 0));
    }
    if (items[i].revents) ++ready;
  }
  return ready;
}

Status RecvMessage(zmq::socket_t& socket, bool router, Message* out, bool dont_wait) {
  out->envelope.clear();
  out->command.clear();
  out->body.rebuild();
  out->user_id.clear();
  out->frames.clear();
  std::vector<zmq::message_t> parts;
  parts.reserve(4);  // [identity,] FERRY1, COMMAND, BODY: one allocation, not three
  try {
    while (true) {
      zmq::message_t part;
      auto got = socket.recv(
          part, parts.empty() && dont_wait ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
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
    if (parts[i].to_string_view() == kTag) {
      tag = i;
      break;
    }
  }
  if (tag == parts.size() || (router && tag == 0)) {
    if (router && !parts.empty()) out->envelope.push_back(std::move(parts[0]));
    return Status(codes::kMalformed, "message has no FERRY1 tag frame");
  }
  // Metadata rides on the frames that came off the wire (the tag frame), not on a ROUTER's
  // routing-id frame.
  if (const char* user = zmq_msg_gets(parts[tag].handle(), "User-Id")) out->user_id = user;
  for (size_t i = 0; i < tag; ++i) out->envelope.push_back(std::move(parts[i]));
  if (parts.size() - tag < 2)
    return Status(codes::kMalformed, "expected FERRY1, COMMAND and BODY frames");
  out->command = std::string(parts[tag + 1].to_string_view());
  if (parts.size() - tag >= 3) out->body = std::move(parts[tag + 2]);
  for (size_t i = tag + 3; i < parts.size(); ++i) out->frames.push_back(std::move(parts[i]));
  if (out->command.empty() || out->command.size() > 32)
    return Status(codes::kMalformed, "bad command frame");
  for (char c : out->command) {
    if (c < 'A' || c > 'Z') return Status(codes::kMalformed, "command must be upper-case ASCII");
  }
  return Status::Ok();
}

Status SendMessage(zmq::socket_t& socket, const std::vector<zmq::message_t>* envelope,
                   std::string_view command, zmq::message_t body,
                   std::vector<zmq::message_t>* frames) {
  try {
    if (envelope) {
      for (const auto& frame : *envelope) {
        zmq::message_t copy(frame.data(), frame.size());
        if (!socket.send(copy, zmq::send_flags::sndmore))
          return Status::Unavailable("send would block");
      }
    }
    const bool more = frames != nullptr && !frames->empty();
    // cppzmq returns an empty optional when the send would block (SNDTIMEO/HWM): report it.
    if (!socket.send(zmq::buffer(kTag), zmq::send_flags::sndmore) ||
        !socket.send(zmq::buffer(command), zmq::send_flags::sndmore) ||
        !socket.send(body, more ? zmq::send_flags::sndmore : zmq::send_flags::none))
      return Status::Unavailable("send would block");
    // The later parts of a message ZeroMQ accepted the first part of are never refused.
    for (size_t i = 0; more && i < frames->size(); ++i) {
      if (!socket.send((*frames)[i],
                       i + 1 < frames->size() ? zmq::send_flags::sndmore : zmq::send_flags::none))
        return Status::Unavailable("send would block");
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("send: ") + e.what());
  }
  return Status::Ok();
}

Status SendTo(zmq::socket_t& socket, std::string_view routing_id, std::string_view command,
              zmq::message_t body, std::vector<zmq::message_t>* frames) {
  try {
    if (!socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore))
      return Status::Unavailable("send would block");
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("send: ") + e.what());
  }
  return SendMessage(socket, nullptr, command, std::move(body), frames);
}

}  // namespace ferry::protocol
