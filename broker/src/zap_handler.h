#pragma once
// ZapHandler: the broker's ZAP handler (ZeroMQ RFC 27), which decides who may connect when the
// broker's sockets are CURVE servers. It owns the REP socket on inproc://zeromq.zap.01 of the
// broker's context, which libzmq asks during every CURVE handshake; the broker's thread polls it
// beside the two ROUTER sockets and calls Handle() when it is readable. Nothing else touches it.
//
// Each ROUTER socket names its role as its ZAP domain: "ferry-producers" on the frontend,
// "ferry-workers" on the backend. A handshake is admitted (200) when the client's public key is in
// that role's allowed keys (the *.key files of --allow-producers / --allow-workers; operators,
// --allow-operators, are admitted on the frontend too), and refused (400) otherwise. The
// connection's User-Id (zmq_msg_gets "User-Id" on each message it sends) is its Z85 public key.
//
// Reload() re-reads the directories (SIGHUP). A connection already admitted stays connected,
// so the broker checks every message's key against the current lists too (IsAllowed): a key
// removed by a reload gets nothing from then on.
//
// Thread-safety: none; the broker's thread only.

#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ferry/status.h"

namespace ferry::broker {

inline constexpr char kProducersDomain[] = "ferry-producers";
inline constexpr char kWorkersDomain[] = "ferry-workers";

class ZapHandler {
 public:
  struct Dirs {
    std::string producers, workers, operators;  // operators may be empty
  };
  // Binds the handler in `context` and reads the key directories. Must run before the broker's
  // sockets bind (libzmq accepts every CURVE client when no handler is bound).
  static Status Create(zmq::context_t& context, Dirs dirs, std::unique_ptr<ZapHandler>* out);

  zmq::socket_t& socket() { return socket_; }
  // Answers the requests waiting on the socket (call when it polls readable).
  void Handle();
  // Re-reads the directories. On error (a directory unreadable) the previous lists stay. With
  // `broken` (SIGHUP) the rest applies whatever file is broken: a key whose file was removed is
  // revoked even while another file is half copied. A broken NAME.key keeps the key NAME had
  // before (a file being rewritten must not revoke its member); a new one adds nothing. Each is
  // appended to *broken as its error. Without `broken` (start-up) any broken file is an error.
  Status Reload(std::vector<std::string>* broken = nullptr);

  bool IsProducer(const std::string& key) const { return producers_.count(key) != 0; }
  bool IsOperator(const std::string& key) const { return operators_.count(key) != 0; }
  bool IsWorker(const std::string& key) const { return workers_.count(key) != 0; }
  // The file name a key came from (for logs), or a short form of the key.
  std::string NameOf(const std::string& key) const;
  size_t producers() const { return producers_.size(); }
  size_t workers() const { return workers_.size(); }
  size_t operators() const { return operators_.size(); }
  int64_t refused() const { return refused_; }

 private:
  ZapHandler(zmq::context_t& context, Dirs dirs);
  Dirs dirs_;
  zmq::socket_t socket_;
  std::map<std::string, std::string> producers_, workers_, operators_;  // key -> name
  int64_t refused_ = 0;
};

}  // namespace ferry::broker
