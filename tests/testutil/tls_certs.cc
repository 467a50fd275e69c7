#include "tls_certs.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "process.h"

namespace ferry::testutil {
namespace {

void Openssl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  Process p(args, dir + "/openssl.log");
  if (p.Wait(std::chrono::seconds(60)) != 0)
    throw std::runtime_error("openssl " + args[1] + " failed: " + p.Log());
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

// A key pair and a certificate for `cn`, signed by the CA (ca/ca_key) with `extensions`, or
// self-signed (a CA) when ca is empty.
void MakeCertificate(const std::string& dir, const std::string& name, const std::string& cn,
                     const std::string& ca, const std::string& ca_key,
                     const std::string& extensions) {
  const std::string key = dir + "/" + name + ".key", crt = dir + "/" + name + ".crt";
  const std::vector<std::string> new_key = {
      "-nodes",  "-newkey", "ec",    "-pkeyopt", "ec_paramgen_curve:prime256v1",
      "-keyout", key,       "-subj", "/CN=" + cn};
  std::vector<std::string> req = {"req", "-new"};
  if (ca.empty()) {
    req.insert(req.end(), {"-x509", "-days", "3"});
    req.insert(req.end(), new_key.begin(), new_key.end());
    req.insert(req.end(), {"-out", crt});
    Openssl(dir, req);
    return;
  }
  const std::string csr = dir + "/" + name + ".csr", ext = dir + "/" + name + ".ext";
  req.insert(req.end(), new_key.begin(), new_key.end());
  req.insert(req.end(), {"-out", csr});
  Openssl(dir, req);
  WriteText(ext, extensions);
  Openssl(dir, {"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days",
                "3", "-extfile", ext, "-out", crt});
}

}  // namespace

TestCertificates MakeTestCertificates(const std::string& dir) {
  TestCertificates c;
  MakeCertificate(dir, "ca", "ferry test CA", "", "", "");
  c.ca = dir + "/ca.crt";
  c.ca_key = dir + "/ca.key";
  MakeCertificate(dir, "server", "127.0.0.1", c.ca, c.ca_key,
                  "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  c.server_cert = dir + "/server.crt";
  c.server_key = dir + "/server.key";
  MakeCertificate(dir, "client", "ferry test client", c.ca, c.ca_key,
                  "extendedKeyUsage=clientAuth\n");
  c.client_cert = dir + "/client.crt";
  c.client_key = dir + "/client.key";
  MakeCertificate(dir, "other-ca", "another CA", "", "", "");
  c.other_ca = dir + "/other-ca.crt";
  return c;
}

std::string Sha256Hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &n, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

std::string DeployAclText() {
  const std::string path = std::string(FERRY_SOURCE_DIR) + "/deploy/redis/users.acl";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAclFile(const std::string& path, std::string acl,
                  const std::map<std::string, std::string>& passwords, const std::string& extra) {
  for (const auto& [placeholder, password] : passwords) {
    const size_t at = acl.find(placeholder);
    if (at == std::string::npos) throw std::runtime_error("no " + placeholder + " in the ACL");
    acl.replace(at, placeholder.size(), Sha256Hex(password));
  }
  if (!acl.empty() && acl.back() != '\n') acl += "\n";
  WriteText(path, acl + extra);
}

void WriteSecretFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write " + path);
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path);
}

}  // namespace ferry::testutil
