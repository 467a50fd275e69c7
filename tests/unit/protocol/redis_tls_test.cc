// RedisClient and RedisSubscriber over TLS, as an ACL user, against a real redis-server with a
// TLS port only and client certificates required (certificates made by openssl in the test):
// multi-MB pipelines and reads byte for byte, AUTH again after a reconnect, a subscriber that
// only reads when poll() says so still gets every message (including those OpenSSL decrypted
// ahead), and each way of being turned away is a clear `unavailable` that names Redis and the
// user and never holds the password.
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ferry/protocol/redis.h"
#include "process.h"
#include "tls_certs.h"

namespace ferry::protocol {
namespace {

constexpr char kPassword[] = "tls-test-pw-8c1f";

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 7 + seed) & 0xff);
  return s;
}

class RedisTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testutil::TempDir();
    certs_ = new testutil::TestCertificates(testutil::MakeTestCertificates(dir_->path()));
    const std::string acl = dir_->path() + "/users.acl";
    // The default user off; `tester` may do anything (the ACL of deploy/ is tested end to end in
    // tests/integration/redis_security_test.cc).
    testutil::WriteAclFile(acl, "user default off\n", {},
                           "user tester on >" + std::string(kPassword) + " ~* &* +@all\n");
    testutil::RedisServer::Options o;
    o.acl_file = acl;
    o.tls = true;
    o.tls_cert = certs_->server_cert;
    o.tls_key = certs_->server_key;
    o.tls_ca = certs_->ca;
    o.user = "tester";
    o.password = kPassword;
    o.client_cert = certs_->client_cert;
    o.client_key = certs_->client_key;
    server_ = new testutil::RedisServer(o);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete certs_;
    delete dir_;
  }
  RedisEndpoint Endpoint() const { return server_->endpoint(); }

  static testutil::TempDir* dir_;
  static testutil::TestCertificates* certs_;
  static testutil::RedisServer* server_;
};
testutil::TempDir* RedisTlsTest::dir_ = nullptr;
testutil::TestCertificates* RedisTlsTest::certs_ = nullptr;
testutil::RedisServer* RedisTlsTest::server_ = nullptr;

TEST_F(RedisTlsTest, BigPipelinesAndReadsArriveByteForByte) {
  std::unique_ptr<RedisClient> client;
  ASSERT_TRUE(RedisClient::Connect(Endpoint(), 5000, &client).ok());
  // Values bigger than a TLS record (16 KiB) and than a socket buffer, by reference and copied,
  // between small commands: partial writes and reads at every layer.
  std::vector<std::string> values;
  for (int i = 0; i < 6; ++i) values.push_back(Pattern((size_t{1} << (12 + 2 * i)) + 3 * i, i));
  std::vector<std::string> keys;
  for (size_t i = 0; i < values.size(); ++i) keys.push_back("tls:k" + std::to_string(i));
  for (size_t i = 0; i < values.size(); ++i) {
    client->AppendByRef({"SET", keys[i], values[i]});
    client->Append({"INCR", "tls:n"});
  }
  std::vector<RedisReply> replies;
  ASSERT_TRUE(client->Flush(&replies).ok());
  ASSERT_EQ(replies.size(), 2 * values.size());
  EXPECT_EQ(replies.back().integer, static_cast<int64_t>(values.size()));
  // GetMany reads each value straight into its string (bypassing the reply parser).
  std::vector<std::string_view> views(keys.begin(), keys.end());
  views.push_back("tls:missing");
  std::vector<std::optional<std::string>> got;
  ASSERT_TRUE(client->GetMany(views, &got).ok());
  ASSERT_EQ(got.size(), values.size() + 1);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_TRUE(*got[i] == values[i]) << "value " << i << " came back changed";
  }
  EXPECT_FALSE(got.back().has_value());
  // GETDEL: read and gone.
  ASSERT_TRUE(client->GetMany({keys[5]}, &got, /*consume=*/true).ok());
  EXPECT_TRUE(got[0].has_value() && *got[0] == values[5]);
  RedisReply reply;
  ASSERT_TRUE(client->Command({"EXISTS", keys[5]}, &reply).ok());
  EXPECT_EQ(reply.integer, 0);
}

TEST_F(RedisTlsTest, ReconnectsWithAuthAfterRedisRestarts) {
  std::unique_ptr<RedisClient> client;
  ASSERT_TRUE(RedisClient::Connect(Endpoint(), 5000, &client).ok());
  RedisReply reply;
  ASSERT_TRUE(client->Command({"SET", "tls:before", "1"}, &reply).ok());
  server_->Restart();  // same port, same ACL file
  // The old connection is gone: the first command fails, the next reconnects -- TLS handshake
  // and AUTH again (the default user is off, so an unauthenticated command would be NOAUTH).
  Status s;
  for (int i = 0; i < 3; ++i) {
    s = client->Command({"SET", "tls:after", "2"}, &reply);
    if (s.ok()) break;
    EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  RedisReply whoami;
  ASSERT_TRUE(client->Command({"ACL", "WHOAMI"}, &whoami).ok());
  EXPECT_EQ(whoami.str, "tester");
}

TEST_F(RedisTlsTest, SubscriberGetsEveryMessageReadingOnlyWhenPollSaysSo) {
  std::unique_ptr<RedisSubscriber> sub;
  ASSERT_TRUE(RedisSubscriber::Connect(Endpoint(), 5000, "tls:chan", &sub).ok());
  auto publisher = server_->Connect();
  ASSERT_NE(publisher, nullptr);
  // Many messages in one burst: OpenSSL decrypts whole records, so after a read it can hold
  // messages that poll() cannot see on the socket. ReadAvailable must drain them.
  constexpr int kMessages = 400;
  std::vector<std::string> sent;
  for (int i = 0; i < kMessages; ++i) {
    sent.push_back(std::to_string(i) + ":" + Pattern(100 + (i * 977) % 9000, i));
    publisher->Append({"PUBLISH", "tls:chan", sent.back()});
  }
  ASSERT_TRUE(publisher->Flush(nullptr).ok());
  std::vector<std::string> received;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (received.size() < sent.size() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{sub->fd(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ASSERT_TRUE(sub->ReadAvailable([&](std::string_view m) { received.emplace_back(m); }).ok());
  }
  ASSERT_EQ(received.size(), sent.size()) << "messages stayed inside OpenSSL, unseen by poll()";
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_TRUE(received[i] == sent[i]) << i;
  // A spurious wake-up reads nothing and does not block.
  ASSERT_TRUE(sub->ReadAvailable([&](std::string_view) { ADD_FAILURE() << "no message"; }).ok());
}

TEST_F(RedisTlsTest, AWrongPasswordNamesRedisAndTheUserNotThePassword) {
  RedisEndpoint ep = Endpoint();
  ep.password = "wrong-pw-77ab";
  bool refused = false;
  Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused) << "a wrong password is no reason to retry";
  EXPECT_TRUE(Contains(s.message(), "redis 127.0.0.1:")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "\"tester\"")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "WRONGPASS")) << s.message();
  EXPECT_FALSE(Contains(s.message(), "wrong-pw-77ab")) << s.message();
  // A client that reconnects gets the same, on every try.
  auto lazy = RedisClient::Lazy(ep, 5000);
  RedisReply reply;
  for (int i = 0; i < 2; ++i) {
    s = lazy->Command({"GET", "k"}, &reply);
    EXPECT_EQ(s.code(), codes::kUnavailable);
    EXPECT_TRUE(Contains(s.message(), "refused the credentials")) << s.message();
    EXPECT_FALSE(Contains(s.message(), "wrong-pw-77ab")) << s.message();
  }
  std::unique_ptr<RedisSubscriber> sub;
  s = RedisSubscriber::Connect(ep, 5000, "tls:chan", &sub);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_FALSE(Contains(s.message(), "wrong-pw-77ab")) << s.message();
  // An unknown user: the same answer (Redis does not say which half is wrong).
  ep.user = "nobody";
  s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(Contains(s.message(), "\"nobody\"")) << s.message();
}

TEST_F(RedisTlsTest, NoPasswordWithTheDefaultUserOffIsRefused) {
  RedisEndpoint ep = Endpoint();
  ep.user.clear();
  ep.password.clear();
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(Contains(s.message(), "wants a password")) << s.message();
}

TEST_F(RedisTlsTest, AServerCertificateFromAnotherCaIsRefusedClearly) {
  RedisEndpoint ep = Endpoint();
  ep.tls_ca = certs_->other_ca;
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(Contains(s.message(), "certificate did not verify")) << s.message();
  EXPECT_TRUE(Contains(s.message(), certs_->other_ca)) << s.message();
}

TEST_F(RedisTlsTest, AHostNameInTheCertificateVerifies) {
  RedisEndpoint ep = Endpoint();
  ep.host = "localhost";  // a DNS name in the certificate's subjectAltName (also sent as SNI)
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(RedisTlsTest, WithoutAClientCertificateRedisClosesAndTheMessageSaysWhy) {
  RedisEndpoint ep = Endpoint();
  ep.tls_cert.clear();
  ep.tls_key.clear();
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(Contains(s.message(), "--redis-tls-cert") || Contains(s.message(), "certificate"))
      << s.message();
}

TEST_F(RedisTlsTest, PlainTcpOnTheTlsPortSaysUseRediss) {
  RedisEndpoint ep = Endpoint();
  ep.tls = false;
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 5000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused);
  EXPECT_TRUE(Contains(s.message(), "rediss://")) << s.message();
  EXPECT_FALSE(Contains(s.message(), kPassword)) << s.message();
}

TEST(RedisPlainTest, TlsOnAPlainPortSaysItIsNotTls) {
  testutil::RedisServer plain;
  RedisEndpoint ep = plain.endpoint();
  ep.tls = true;
  bool refused = false;
  const Status s = CheckRedisAccess(ep, 3000, &refused);
  EXPECT_EQ(s.code(), codes::kUnavailable);
  EXPECT_TRUE(refused) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "TLS")) << s.message();
}

}  // namespace
}  // namespace ferry::protocol
