#pragma once
// TLS and ACL material for tests of Redis security (docs/security.md): certificates made with
// the openssl CLI, and deploy/redis/users.acl with test passwords filled in.

#include <map>
#include <string>

namespace ferry::testutil {

// PEM files in one directory: a CA; a server certificate for 127.0.0.1 and localhost and a
// client certificate, both signed by that CA; and a second, unrelated CA (for "wrong CA" tests).
// EC P-256 keys, unencrypted. Throws std::runtime_error (with openssl's output) on failure.
struct TestCertificates {
  std::string ca, ca_key;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
  std::string other_ca;
};
TestCertificates MakeTestCertificates(const std::string& dir);

// Lower-case hex SHA-256 of `text`: how Redis ACL files hold passwords (#<hash>).
std::string Sha256Hex(const std::string& text);

// deploy/redis/users.acl of this source tree, as text.
std::string DeployAclText();

// `acl` with each placeholder (a key of `passwords`, e.g. "BROKER_PASSWORD_SHA256") replaced by
// the SHA-256 of its password, and `extra` appended (e.g. an admin user for the test itself);
// written to `path`. Throws std::runtime_error when a placeholder is not in `acl`.
void WriteAclFile(const std::string& path, std::string acl,
                  const std::map<std::string, std::string>& passwords, const std::string& extra);

// Writes `text` to `path` with mode 0600 (a password file).
void WriteSecretFile(const std::string& path, const std::string& text);

}  // namespace ferry::testutil
