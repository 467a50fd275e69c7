#include "ferry/protocol/curve.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

namespace ferry::protocol {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// A Z85 key decodes to 32 bytes.
bool ValidZ85Key(const std::string& z85) {
  if (z85.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, z85.c_str()) != nullptr;
}

std::string Header(bool secret) {
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::gmtime(&now));
  std::string h = std::string("#   ****  Generated on ") + when + " by ferry keygen  ****\n";
  if (secret) {
    h += "#   ZeroMQ CURVE **Secret** Certificate\n"
         "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n";
  } else {
    h += "#   ZeroMQ CURVE Public Certificate\n"
         "#   Exchange securely, or use a secure mechanism to verify the contents\n"
         "#   of this file after exchange.\n\n";
  }
  return h;
}

// Creates `path` exclusively with `mode` and writes `text`.
Status WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) return Status::InvalidArgument(path + " already exists (not overwritten)");
    return Status::InvalidArgument("cannot create " + path + ": " + std::strerror(errno));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Status::Internal("writing " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);  // whatever the umask did
  ::close(fd);
  return Status::Ok();
}

// The value of `key = "..."` on a line of a ZPL certificate; empty when the line is not that key.
std::string ValueOf(const std::string& line, const std::string& key) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string::npos || line.compare(i, key.size(), key) != 0) return "";
  i = line.find_first_not_of(" \t", i + key.size());
  if (i == std::string::npos || line[i] != '=') return "";
  std::string v = line.substr(i + 1);
  const size_t b = v.find_first_not_of(" \t\"'");
  const size_t e = v.find_last_not_of(" \t\r\"'");
  return b == std::string::npos ? "" : v.substr(b, e - b + 1);
}

}  // namespace

Status GenerateCurveKeyPair(CurveKeyPair* out) {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0)
    return Status::Internal(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()) +
                            " (libzmq built without CURVE?)");
  out->public_key = pub;
  out->secret_key = sec;
  return Status::Ok();
}

Status WriteCertificates(const std::string& dir, const std::string& name,
                         const CurveKeyPair& keys) {
  if (!ValidName(name))
    return Status::InvalidArgument("key name \"" + name +
                                   "\": 1-64 characters of [A-Za-z0-9._-], not starting with '.'");
  if (!ValidZ85Key(keys.public_key) || !ValidZ85Key(keys.secret_key))
    return Status::InvalidArgument("not a CURVE key pair");
  const std::string base = dir + "/" + name;
  for (const std::string& path : {base + ".key", base + ".key_secret"}) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0)
      return Status::InvalidArgument(path + " already exists (not overwritten)");
  }
  const std::string public_part = "metadata\n    name = \"" + name +
                                  "\"\ncurve\n    public-key = \"" + keys.public_key + "\"\n";
  FERRY_RETURN_IF_ERROR(WriteNew(
      base + ".key_secret",
      Header(true) + public_part + "    secret-key = \"" + keys.secret_key + "\"\n", 0600));
  return WriteNew(base + ".key", Header(false) + public_part, 0644);
}

Status ReadCertificate(const std::string& path, bool need_secret, CurveKeyPair* out) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("cannot read CURVE certificate " + path);
  CurveKeyPair keys;
  std::string line;
  while (std::getline(in, line)) {
    if (std::string v = ValueOf(line, "public-key"); !v.empty()) keys.public_key = v;
    if (std::string v = ValueOf(line, "secret-key"); !v.empty()) keys.secret_key = v;
  }
  if (!ValidZ85Key(keys.public_key))
    return Status::InvalidArgument(path + ": no valid public-key (40 characters of Z85)");
  if (need_secret) {
    if (!ValidZ85Key(keys.secret_key))
      return Status::InvalidArgument(path +
                                     ": no valid secret-key: give the .key_secret file, not .key");
    char derived[41];
    if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0 || keys.public_key != derived)
      return Status::InvalidArgument(path + ": its public-key does not belong to its secret-key");
  } else {
    keys.secret_key.clear();  // never carried around when not needed
  }
  *out = std::move(keys);
  return Status::Ok();
}

Status ReadPublicKeys(const std::string& dir, std::map<std::string, std::string>* out,
                      std::vector<std::pair<std::string, std::string>>* broken) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return Status::InvalidArgument("cannot read key directory " + dir + ": " +
                                   std::strerror(errno));
  std::vector<std::string> files;
  while (struct dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".key") == 0 && n[0] != '.') files.push_back(n);
  }
  ::closedir(d);
  std::map<std::string, std::string> keys;
  for (const std::string& f : files) {
    CurveKeyPair k;
    Status s = ReadCertificate(dir + "/" + f, /*need_secret=*/false, &k);
    if (!s.ok() && broken == nullptr) return s;
    if (!s.ok()) {
      broken->emplace_back(f.substr(0, f.size() - 4), s.message());
      continue;
    }
    keys.emplace(k.public_key, f.substr(0, f.size() - 4));
  }
  *out = std::move(keys);
  return Status::Ok();
}

Status ApplyCurveClient(zmq::socket_t& socket, const std::string& server_public_file,
                        const std::string& secret_file) {
  if (server_public_file.empty() && secret_file.empty()) return Status::Ok();
  if (server_public_file.empty() || secret_file.empty())
    return Status::InvalidArgument(
        "CURVE needs both the broker's public key (--curve-server-public) and this "
        "client's secret key (--curve-secret)");
  CurveKeyPair server, own;
  FERRY_RETURN_IF_ERROR(ReadCertificate(server_public_file, /*need_secret=*/false, &server));
  FERRY_RETURN_IF_ERROR(ReadCertificate(secret_file, /*need_secret=*/true, &own));
  try {
    socket.set(zmq::sockopt::curve_serverkey, server.public_key);
    socket.set(zmq::sockopt::curve_publickey, own.public_key);
    socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("setting CURVE keys: ") + e.what());
  }
  return Status::Ok();
}

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string host = endpoint.substr(6);
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
    return host == "::1";
  }
  host = host.substr(0, host.rfind(':'));
  if (host == "localhost" || host == "lo") return true;
  return host.rfind("127.", 0) == 0;
}

std::string DescribeHandshakeFailure(int event, int value, bool curve_configured) {
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    return "the broker refused this client's CURVE key (ZAP status " + std::to_string(value) +
           "): its public key is not in the broker's allowed keys";
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
      return curve_configured
                 ? "the broker does not use CURVE but this client does (security mechanism "
                   "mismatch)"
                 : "the broker requires CURVE: give the broker's public key "
                   "(--curve-server-public) and this client's secret key (--curve-secret)";
    return "the handshake with the broker failed with a protocol error (ZMTP code " +
           std::to_string(value) + ")";
  }
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    return curve_configured ? "the CURVE handshake with the broker failed: the broker's public "
                              "key (--curve-server-public) is not the key of the broker at "
                              "that address"
                            : "the handshake with the broker failed";
  return "";
}

void HandshakeWatch::ReadEvents(zmq::socket_t& monitor) {
  // Each event: a frame of uint16 event + uint32 value, then a frame with the endpoint.
  for (int i = 0; i < 64; ++i) {
    zmq::message_t head, endpoint;
    try {
      if (!monitor.recv(head, zmq::recv_flags::dontwait)) return;
      if (head.more()) (void)monitor.recv(endpoint, zmq::recv_flags::none);
    } catch (const zmq::error_t&) {
      return;
    }
    if (head.size() < 6) continue;
    uint16_t event;
    uint32_t value;
    std::memcpy(&event, head.data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof(value));
    OnEvent(event, static_cast<int>(value));
  }
}

void HandshakeWatch::OnEvent(int event, int value) {
  switch (event) {
    case ZMQ_EVENT_CONNECTED:
      succeeded_ = false;
      return;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
      succeeded_ = true;
      error_.clear();
      return;
    case ZMQ_EVENT_DISCONNECTED:
      ++disconnects_;
      if (!succeeded_ && curve_ && error_.empty())
        error_ =
            "the broker closed the connection during the CURVE handshake: the broker's public "
            "key (--curve-server-public) is not the key of the broker at that address, or this "
            "client's key is not listed";
      succeeded_ = false;
      return;
    default:
      if (std::string why = DescribeHandshakeFailure(event, value, curve_); !why.empty())
        error_ = std::move(why);
  }
}

}  // namespace ferry::protocol
