// CurveZMQ certificate files (protocol/src/curve.cc): what `ferry keygen` writes, what it reads,
// and that the files interoperate with pyzmq's zmq.auth (the czmq zcert text format) both ways.
#include "ferry/protocol/curve.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "process.h"

namespace ferry::protocol {
namespace {

namespace fs = std::filesystem;
using testutil::TempDir;

int Mode(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 0777);
}

// Runs `python3 -c CODE` and returns its stdout ("" and *ok = false when it fails).
std::string Python(const std::string& code, bool* ok) {
  TempDir dir;
  const std::string script = dir.path() + "/run.py";
  std::ofstream(script) << code;
  const std::string out = dir.path() + "/out.txt";
  const int rc = std::system(("/usr/bin/python3 " + script + " > " + out + " 2>&1").c_str());
  *ok = rc == 0;
  return testutil::ReadFile(out);
}

bool HavePyzmq() {
  bool ok = false;
  Python("import zmq.auth\n", &ok);
  return ok;
}

TEST(Curve, WrittenCertificatesReadBackWithTheirModes) {
  TempDir dir;
  CurveKeyPair keys;
  ASSERT_TRUE(GenerateCurveKeyPair(&keys).ok());
  ASSERT_TRUE(WriteCertificates(dir.path(), "gpu-0", keys).ok());
  EXPECT_EQ(Mode(dir.path() + "/gpu-0.key_secret"), 0600);
  EXPECT_EQ(Mode(dir.path() + "/gpu-0.key"), 0644);

  CurveKeyPair pub, secret;
  ASSERT_TRUE(ReadCertificate(dir.path() + "/gpu-0.key", false, &pub).ok());
  EXPECT_EQ(pub.public_key, keys.public_key);
  EXPECT_TRUE(pub.secret_key.empty());
  ASSERT_TRUE(ReadCertificate(dir.path() + "/gpu-0.key_secret", true, &secret).ok());
  EXPECT_EQ(secret.public_key, keys.public_key);
  EXPECT_EQ(secret.secret_key, keys.secret_key);
  // The public file is not a secret one.
  Status s = ReadCertificate(dir.path() + "/gpu-0.key", true, &secret);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("gpu-0.key"), std::string::npos) << s.ToString();
}

TEST(Curve, KeysAreNeverOverwrittenAndNamesAreChecked) {
  TempDir dir;
  CurveKeyPair a, b;
  ASSERT_TRUE(GenerateCurveKeyPair(&a).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&b).ok());
  ASSERT_TRUE(WriteCertificates(dir.path(), "broker", a).ok());
  EXPECT_FALSE(WriteCertificates(dir.path(), "broker", b).ok());
  CurveKeyPair read;
  ASSERT_TRUE(ReadCertificate(dir.path() + "/broker.key_secret", true, &read).ok());
  EXPECT_EQ(read.secret_key, a.secret_key);
  for (const char* bad : {"", "../x", "a/b", ".hidden", "sp ace"})
    EXPECT_EQ(WriteCertificates(dir.path(), bad, b).code(), codes::kInvalidArgument) << bad;
}

TEST(Curve, BrokenOrMismatchedCertificatesAreRefusedByName) {
  TempDir dir;
  CurveKeyPair a, b;
  ASSERT_TRUE(GenerateCurveKeyPair(&a).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&b).ok());
  const std::string mixed = dir.path() + "/mixed.key_secret";
  std::ofstream(mixed) << "metadata\ncurve\n    public-key = \"" << a.public_key
                       << "\"\n    secret-key = \"" << b.secret_key << "\"\n";
  CurveKeyPair out;
  Status s = ReadCertificate(mixed, true, &out);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_NE(s.message().find("mixed.key_secret"), std::string::npos) << s.ToString();

  const std::string garbage = dir.path() + "/garbage.key";
  std::ofstream(garbage) << "curve\n    public-key = \"not z85\"\n";
  EXPECT_EQ(ReadCertificate(garbage, false, &out).code(), codes::kInvalidArgument);
  EXPECT_EQ(ReadCertificate(dir.path() + "/missing.key", false, &out).code(),
            codes::kInvalidArgument);
}

TEST(Curve, AnAllowDirectoryListsPublicKeysOnly) {
  TempDir dir;
  CurveKeyPair a, b;
  ASSERT_TRUE(GenerateCurveKeyPair(&a).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&b).ok());
  ASSERT_TRUE(WriteCertificates(dir.path(), "api", a).ok());
  ASSERT_TRUE(WriteCertificates(dir.path(), "batch", b).ok());
  std::ofstream(dir.path() + "/README") << "not a key\n";
  std::map<std::string, std::string> keys;
  ASSERT_TRUE(ReadPublicKeys(dir.path(), &keys).ok());
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[a.public_key], "api");
  EXPECT_EQ(keys[b.public_key], "batch");
  EXPECT_FALSE(ReadPublicKeys(dir.path() + "/nope", &keys).ok());
}

TEST(Curve, PyzmqReadsFerrysCertificatesAndFerryReadsPyzmqs) {
  if (!HavePyzmq()) GTEST_SKIP() << "python3-zmq is not installed";
  TempDir dir;
  CurveKeyPair ours;
  ASSERT_TRUE(GenerateCurveKeyPair(&ours).ok());
  ASSERT_TRUE(WriteCertificates(dir.path(), "ferry", ours).ok());
  bool ok = false;
  const std::string out = Python(
      "import zmq.auth\n"
      "pub, sec = zmq.auth.load_certificate('" +
          dir.path() +
          "/ferry.key_secret')\n"
          "print(pub.decode(), sec.decode())\n"
          "pub2, _ = zmq.auth.load_certificate('" +
          dir.path() +
          "/ferry.key')\n"
          "print(pub2.decode())\n"
          "zmq.auth.create_certificates('" +
          dir.path() +
          "', 'py')\n"
          "p, s = zmq.auth.load_certificate('" +
          dir.path() +
          "/py.key_secret')\n"
          "print(p.decode(), s.decode())\n",
      &ok);
  ASSERT_TRUE(ok) << out;
  EXPECT_NE(out.find(ours.public_key + " " + ours.secret_key + "\n" + ours.public_key + "\n"),
            std::string::npos)
      << out;
  CurveKeyPair theirs;
  ASSERT_TRUE(ReadCertificate(dir.path() + "/py.key_secret", true, &theirs).ok());
  EXPECT_NE(out.find(theirs.public_key + " " + theirs.secret_key), std::string::npos) << out;
  std::map<std::string, std::string> listed;
  ASSERT_TRUE(ReadPublicKeys(dir.path(), &listed).ok());
  EXPECT_EQ(listed[theirs.public_key], "py");
}

TEST(Curve, LoopbackEndpoints) {
  for (const char* e : {"tcp://127.0.0.1:5555", "tcp://127.1.2.3:1", "tcp://localhost:5555",
                        "tcp://[::1]:5555", "ipc:///tmp/ferry.sock", "inproc://x"})
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  for (const char* e : {"tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://10.0.0.5:5555",
                        "tcp://eth0:5555", "tcp://[::]:5555", "tcp://example.com:5555"})
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
}

TEST(Curve, HandshakeWatchSaysWhatWentWrong) {
  HandshakeWatch watch(/*curve_configured=*/true);
  watch.OnEvent(ZMQ_EVENT_CONNECTED, 0);
  watch.OnEvent(ZMQ_EVENT_DISCONNECTED, 0);  // closed mid-handshake: wrong server key
  EXPECT_NE(watch.error().find("--curve-server-public"), std::string::npos) << watch.error();
  watch.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400);
  EXPECT_NE(watch.error().find("not in the broker's allowed keys"), std::string::npos);
  watch.OnEvent(ZMQ_EVENT_CONNECTED, 0);
  watch.OnEvent(ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0);
  EXPECT_EQ(watch.error(), "");
  watch.OnEvent(ZMQ_EVENT_DISCONNECTED, 0);  // after a handshake: a broker restart, not keys
  EXPECT_EQ(watch.error(), "");

  HandshakeWatch plain(/*curve_configured=*/false);
  plain.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH);
  EXPECT_NE(plain.error().find("requires CURVE"), std::string::npos) << plain.error();
}

}  // namespace
}  // namespace ferry::protocol
