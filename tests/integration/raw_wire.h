#pragma once
// Speaking the wire protocol by hand over a raw DEALER, as a client (or a worker) in another
// language does (docs/protocol.md): for wire_test.cc and wire_limits_test.cc.

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
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

// The bytes a message of `frames` takes on the wire (ZMTP 3 without CURVE): each frame is
// preceded by a flags byte and its size, in 1 byte or, past 255, in 8.
inline size_t WireBytes(const std::vector<std::string>& frames) {
  size_t n = 0;
  for (const auto& f : frames) n += (f.size() > 255 ? 9 : 2) + f.size();
  return n;
}

// The bytes that arrived on the TCP connections accepted at `endpoint` (tcp://127.0.0.1:PORT)
// and that their process has not read yet: the sum of their kernel receive queues
// (/proc/net/tcp, state 01, established).
inline size_t UnreadBytes(const std::string& endpoint) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  size_t unread = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues;  // queues: "TX:RX", in hex
    fields >> slot >> local >> remote >> state >> queues;
    const size_t colon = local.find(':');
    if (colon == std::string::npos || state != "01" || queues.find(':') == std::string::npos ||
        std::stoi(local.substr(colon + 1), nullptr, 16) != port)
      continue;
    unread += std::stoul(queues.substr(queues.find(':') + 1), nullptr, 16);
  }
  return unread;
}

// Waits until every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat):
// kill(SIGSTOP) returns before they are, and a thread still running may yet read what is sent
// next. False when they are not within `timeout_ms`.
inline bool WaitUntilStopped(pid_t pid, int timeout_ms = 20000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  for (;;) {
    bool all = true;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');  // the state follows the command name, ") S ..."
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T')
        all = false;
    }
    if (all && !ec) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Waits until a process stopped by SIGSTOP has `bytes` more waiting unread at `endpoint` than
// `before` (UnreadBytes before the sends): messages sent to it (RawSend only queues them for
// libzmq's I/O thread) have all reached its socket, so that it reads them together once it goes
// on. False when they have not within `timeout_ms`.
inline bool WaitUntilUnread(const std::string& endpoint, size_t before, size_t bytes,
                            int timeout_ms = 20000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (UnreadBytes(endpoint) < before + bytes) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
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
