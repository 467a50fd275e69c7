#include <httplib.h>

#include <algorithm>

#include "ferry/metrics/metrics_server.h"

namespace ferry::metrics {

Status HttpGet(const std::string& url, int timeout_ms, std::string* body) {
  // http://HOST[:PORT][/PATH]; a bare HOST:PORT means http://HOST:PORT/metrics.
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0)
    rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos)
    return Status::InvalidArgument("only http:// URLs are supported: " + url);
  size_t slash = rest.find('/');
  std::string host_port = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "/metrics" : rest.substr(slash);
  std::string host = host_port;
  int port = 80;
  size_t colon = host_port.rfind(':');
  if (colon != std::string::npos) {
    host = host_port.substr(0, colon);
    try {
      port = std::stoi(host_port.substr(colon + 1));
    } catch (...) {
      return Status::InvalidArgument("bad port in " + url);
    }
  }
  if (host.empty()) return Status::InvalidArgument("no host in " + url);

  httplib::Client client(host, port);
  time_t sec = timeout_ms / 1000, usec = (timeout_ms % 1000) * 1000;
  client.set_connection_timeout(sec, usec);
  client.set_read_timeout(sec, usec);
  client.set_write_timeout(sec, usec);
  httplib::Result res = client.Get(path.c_str());
  if (!res) return Status::Unavailable("GET " + url + ": " + httplib::to_string(res.error()));
  if (res->status != 200) {
    // The body's first line says why (a 503 from /healthz: "redis ... unreachable: ...").
    std::string why = res->body.substr(0, std::min<size_t>(res->body.find('\n'), 300));
    return Status::Unavailable("GET " + url + ": HTTP " + std::to_string(res->status) +
                               (why.empty() ? "" : ": " + why));
  }
  *body = res->body;
  return Status::Ok();
}

}  // namespace ferry::metrics
