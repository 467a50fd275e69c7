#pragma once
// CurveZMQ keys for Ferry's sockets (docs/security.md).
//
// Keys live in ZeroMQ certificate files, the text format of czmq's zcert and pyzmq's
// zmq.auth.create_certificates, so that keys made by those tools work here and Ferry's work
// there:
//
//   NAME.key          the public certificate (mode 0644): metadata + curve / public-key
//   NAME.key_secret   the secret certificate (mode 0600): the same plus curve / secret-key
//
//   metadata
//   curve
//       public-key = "<40 characters of Z85>"
//       secret-key = "<40 characters of Z85>"      (NAME.key_secret only)
//
// The broker is a CURVE server on both sockets (its own .key_secret) and admits only clients
// whose public key is in a directory of allowed .key files (one per role: producers, workers,
// operators), checked by its ZAP handler. Clients (workers, producers, the CLI) name the
// broker's public .key and their own .key_secret.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "ferry/status.h"

namespace ferry::protocol {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty for a public certificate
};

// A fresh key pair (libzmq's zmq_curve_keypair). internal when libzmq lacks CURVE.
Status GenerateCurveKeyPair(CurveKeyPair* out);

// Writes DIR/NAME.key and DIR/NAME.key_secret (mode 0600, created without ever being readable
// by others). invalid_argument for a NAME that is not 1-64 of [A-Za-z0-9._-]; already_exists
// (invalid_argument) when either file exists: keys are never overwritten.
Status WriteCertificates(const std::string& dir, const std::string& name, const CurveKeyPair& keys);

// Reads a certificate file. `need_secret`: the file must hold a secret key (a .key_secret).
// invalid_argument naming the file when it is missing, unreadable, or its keys are not Z85 of 32
// bytes; a secret certificate whose public key does not match its secret key is refused too.
Status ReadCertificate(const std::string& path, bool need_secret, CurveKeyPair* out);

// The public keys of every *.key file in `dir` (not *.key_secret), as public key -> the file's
// name without ".key". invalid_argument when the directory cannot be read, or a file is broken
// and `broken` is null; else each broken file is left out and appended to *broken as its name
// (without ".key") and its error.
Status ReadPublicKeys(const std::string& dir, std::map<std::string, std::string>* out,
                      std::vector<std::pair<std::string, std::string>>* broken = nullptr);

// The client side of CURVE on `socket` (a DEALER connecting to the broker): the broker's public
// key from `server_public_file` (its .key) and our pair from `secret_file` (our .key_secret).
// Both empty: nothing (plaintext). One without the other: invalid_argument.
Status ApplyCurveClient(zmq::socket_t& socket, const std::string& server_public_file,
                        const std::string& secret_file);

// True for endpoints only this host can reach: ipc://, inproc://, and tcp:// on 127.0.0.0/8,
// [::1] or localhost. A wildcard (tcp://*:5555), 0.0.0.0 or an interface is not.
bool IsLoopbackEndpoint(const std::string& endpoint);

// What a socket monitor said about the last connection attempt of a client socket, for errors
// a person can act on: "" when nothing is known.
std::string DescribeHandshakeFailure(int zmq_event, int value, bool curve_configured);

// Follows a client socket's monitor events (subscribe to kHandshakeWatchEvents) and keeps what a
// person should read when the broker does not answer: "" while the last connection is fine.
// A CURVE server that cannot open our HELLO (we named the wrong server key) sends no error: it
// closes the connection, so a disconnect before the handshake succeeded says that too.
class HandshakeWatch {
 public:
  explicit HandshakeWatch(bool curve_configured) : curve_(curve_configured) {}
  void OnEvent(int zmq_event, int value);
  // Takes the events waiting on `monitor` (the PAIR socket connected to zmq_socket_monitor's
  // endpoint), at most 64 a call, without blocking; stops at the first receive error.
  void ReadEvents(zmq::socket_t& monitor);
  const std::string& error() const { return error_; }
  // Connections lost so far (ZMQ_EVENT_DISCONNECTED): what the peer told about itself on the
  // last one (e.g. the broker's LIMITS) may not hold for the next.
  int64_t disconnects() const { return disconnects_; }

 private:
  bool curve_;
  bool succeeded_ = false;  // since the last CONNECTED
  std::string error_;
  int64_t disconnects_ = 0;
};
inline constexpr int kHandshakeWatchEvents =
    ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
    ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

}  // namespace ferry::protocol
