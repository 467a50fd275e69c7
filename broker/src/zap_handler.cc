#include "zap_handler.h"

#include <spdlog/spdlog.h>

#include <vector>

#include "ferry/protocol/curve.h"

namespace ferry::broker {

ZapHandler::ZapHandler(zmq::context_t& context, Dirs dirs)
    : dirs_(std::move(dirs)), socket_(context, zmq::socket_type::rep) {}

Status ZapHandler::Create(zmq::context_t& context, Dirs dirs, std::unique_ptr<ZapHandler>* out) {
  std::unique_ptr<ZapHandler> h(new ZapHandler(context, std::move(dirs)));
  FERRY_RETURN_IF_ERROR(h->Reload());
  try {
    h->socket_.set(zmq::sockopt::linger, 0);
    h->socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("binding the ZAP handler: ") + e.what());
  }
  *out = std::move(h);
  return Status::Ok();
}

Status ZapHandler::Reload(std::vector<std::string>* broken) {
  std::map<std::string, std::string> producers, workers, operators;
  // Reads one directory into *to; with `broken`, a broken NAME.key keeps NAME's keys in `before`.
  auto read = [broken](const std::string& dir, const std::map<std::string, std::string>& before,
                       std::map<std::string, std::string>* to) -> Status {
    std::vector<std::pair<std::string, std::string>> bad;
    FERRY_RETURN_IF_ERROR(protocol::ReadPublicKeys(dir, to, broken ? &bad : nullptr));
    for (const auto& [name, why] : bad) {
      for (const auto& [key, was] : before)
        if (was == name) to->emplace(key, was);
      broken->push_back(why);
    }
    return Status::Ok();
  };
  FERRY_RETURN_IF_ERROR(read(dirs_.producers, producers_, &producers));
  FERRY_RETURN_IF_ERROR(read(dirs_.workers, workers_, &workers));
  if (!dirs_.operators.empty())
    FERRY_RETURN_IF_ERROR(read(dirs_.operators, operators_, &operators));
  producers_ = std::move(producers);
  workers_ = std::move(workers);
  operators_ = std::move(operators);
  return Status::Ok();
}

std::string ZapHandler::NameOf(const std::string& key) const {
  for (const auto* m : {&workers_, &producers_, &operators_})
    if (auto it = m->find(key); it != m->end()) return it->second;
  return "key " + key.substr(0, 8) + "...";
}

void ZapHandler::Handle() {
  // Requests: version, request id, domain, address, routing id, mechanism, credentials...
  // Replies: version, request id, status code, status text, user id, metadata.
  for (int turn = 0; turn < 64; ++turn) {
    std::vector<zmq::message_t> frames;
    try {
      while (true) {
        zmq::message_t part;
        if (!socket_.recv(part, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none))
          return;  // nothing waiting
        const bool more = part.more();
        frames.push_back(std::move(part));
        if (!more || frames.size() > 16) break;
      }
    } catch (const zmq::error_t& e) {
      spdlog::error("ZAP handler: recv: {}", e.what());
      return;
    }
    std::string code = "400", text = "not allowed", user;
    if (frames.size() >= 6 && frames[0].to_string_view() == "1.0") {
      const std::string domain(frames[2].to_string_view());
      const std::string mechanism(frames[5].to_string_view());
      if (mechanism == "CURVE" && frames.size() >= 7 && frames[6].size() == 32) {
        char z85[41];
        zmq_z85_encode(z85, static_cast<const uint8_t*>(frames[6].data()), 32);
        const std::string key(z85);
        const bool allowed = domain == kWorkersDomain ? IsWorker(key)
                                                      : domain == kProducersDomain &&
                                                            (IsProducer(key) || IsOperator(key));
        if (allowed) {
          code = "200";
          text = "OK";
          user = key;
        } else {
          ++refused_;
          if (refused_ <= 10 || refused_ % 1000 == 0)
            spdlog::warn(
                "refused a {} connection from {}: key {} is not allowed ({} refused so far)",
                domain == kWorkersDomain ? "worker" : "producer",
                std::string(frames[3].to_string_view()), key, refused_);
        }
      } else {
        text = "CURVE required";
      }
    }
    try {
      const std::string version = frames.empty() ? "1.0" : std::string(frames[0].to_string_view());
      const std::string request_id =
          frames.size() > 1 ? std::string(frames[1].to_string_view()) : "";
      socket_.send(zmq::buffer(version), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(code), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
      socket_.send(zmq::message_t(), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      spdlog::error("ZAP handler: send: {}", e.what());
      return;
    }
  }
}

}  // namespace ferry::broker
