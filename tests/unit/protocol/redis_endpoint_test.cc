// ParseRedisUrl, RedactRedisUrl, StripRedisPassword and ResolveRedisEndpoint: every URL form the
// components take (docs/security.md), bad forms rejected with a message that says what is wrong
// and never holds the password, and the files of --redis-password-file / --redis-tls-* read and
// checked at start (certificates made by openssl in the test).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "ferry/protocol/redis_endpoint.h"
#include "process.h"
#include "tls_certs.h"

namespace ferry::protocol {
namespace {

RedisEndpoint Parse(const std::string& url) {
  RedisEndpoint ep;
  const Status s = ParseRedisUrl(url, &ep);
  EXPECT_TRUE(s.ok()) << url << ": " << s.ToString();
  return ep;
}

// The failure for `url`; it must be invalid_argument and must not contain `secret`.
Status Bad(const std::string& url, const std::string& secret = "s3cret") {
  RedisEndpoint ep;
  const Status s = ParseRedisUrl(url, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument) << url << ": " << s.ToString();
  EXPECT_EQ(s.message().find(secret), std::string::npos) << s.message();
  return s;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RedisUrlTest, PlainHostPortAndDatabase) {
  RedisEndpoint ep = Parse("redis://10.0.0.7:6380/3");
  EXPECT_EQ(ep.host, "10.0.0.7");
  EXPECT_EQ(ep.port, 6380);
  EXPECT_EQ(ep.db, 3);
  EXPECT_FALSE(ep.tls);
  EXPECT_TRUE(ep.user.empty());
  EXPECT_TRUE(ep.password.empty());
  ep = Parse("redis://redis.internal:6379");
  EXPECT_EQ(ep.host, "redis.internal");
  EXPECT_EQ(ep.db, 0);
  ep = Parse("redis://redis.internal:6379/");  // an empty path is database 0
  EXPECT_EQ(ep.db, 0);
  ep = Parse("redis://h");  // the default port
  EXPECT_EQ(ep.port, 6379);
  ep = Parse("127.0.0.1:7000");  // no scheme: plain TCP
  EXPECT_EQ(ep.port, 7000);
  EXPECT_FALSE(ep.tls);
}

TEST(RedisUrlTest, UserPasswordAndTls) {
  RedisEndpoint ep = Parse("rediss://ferry-broker:s3cret@redis.internal:6379/0");
  EXPECT_TRUE(ep.tls);
  EXPECT_EQ(ep.user, "ferry-broker");
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.UserName(), "ferry-broker");
  ep = Parse("redis://:s3cret@h:1");  // Redis's default user (AUTH PASSWORD)
  EXPECT_TRUE(ep.user.empty());
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.UserName(), "default");
  ep = Parse("redis://alice@h:1");  // a user alone: the password comes from a file
  EXPECT_EQ(ep.user, "alice");
  EXPECT_TRUE(ep.password.empty());
}

TEST(RedisUrlTest, PercentEncodedUserAndPassword) {
  RedisEndpoint ep = Parse("redis://us%40er:p%40ss%3Aw%2Fo%25rd@h:1/2");
  EXPECT_EQ(ep.user, "us@er");
  EXPECT_EQ(ep.password, "p@ss:w/o%rd");
  EXPECT_EQ(ep.db, 2);
  // Unencoded '@' and ':' in the password still work: the host starts after the last '@', the
  // password after the first ':'.
  ep = Parse("redis://u:p@ss:w@h:1");
  EXPECT_EQ(ep.user, "u");
  EXPECT_EQ(ep.password, "p@ss:w");
  EXPECT_EQ(ep.host, "h");
  EXPECT_EQ(ep.port, 1);
}

TEST(RedisUrlTest, Ipv6InBrackets) {
  RedisEndpoint ep = Parse("rediss://u:s3cret@[::1]:6390/4");
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, 6390);
  EXPECT_EQ(ep.db, 4);
  EXPECT_EQ(ep.Describe(), "rediss://u:***@[::1]:6390/4");
  ep = Parse("redis://[fe80::1]");
  EXPECT_EQ(ep.host, "fe80::1");
  EXPECT_EQ(ep.port, 6379);
  EXPECT_TRUE(Contains(Bad("redis://::1:6379").message(), "brackets"));
  EXPECT_TRUE(Contains(Bad("redis://[::1:6379").message(), "unclosed"));
  EXPECT_TRUE(Contains(Bad("redis://[::1]6379").message(), "after ']'"));
}

TEST(RedisUrlTest, UnixSocket) {
  RedisEndpoint ep = Parse("unix:///run/redis/redis.sock");
  EXPECT_EQ(ep.unix_path, "/run/redis/redis.sock");
  EXPECT_EQ(ep.db, 0);
  EXPECT_FALSE(ep.tls);
  EXPECT_EQ(ep.Address(), "unix:/run/redis/redis.sock");
  EXPECT_EQ(ep.Describe(), "unix:///run/redis/redis.sock");
  ep = Parse("unix://ferry-worker:s3cret@/tmp/r.sock?db=3");
  EXPECT_EQ(ep.unix_path, "/tmp/r.sock");
  EXPECT_EQ(ep.user, "ferry-worker");
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.db, 3);
  EXPECT_EQ(ep.Describe(), "unix://ferry-worker:***@/tmp/r.sock?db=3");
  ep = Parse("unix:///tmp/a@b.sock");  // no user part: an '@' in the path is the path's
  EXPECT_EQ(ep.unix_path, "/tmp/a@b.sock");
  EXPECT_TRUE(ep.user.empty());
  ep = Parse("unix://u:p%2Fw@/tmp/a@b.sock");  // the user part ends before the path's '/'
  EXPECT_EQ(ep.unix_path, "/tmp/a@b.sock");
  EXPECT_EQ(ep.password, "p/w");

  EXPECT_TRUE(Contains(Bad("unix://u:s3cret@tmp/r.sock").message(), "absolute socket path"));
  EXPECT_TRUE(Contains(Bad("unix://").message(), "absolute socket path"));
  EXPECT_TRUE(Contains(Bad("unix://u:s3cret@/r.sock?database=1").message(), "db=NUMBER"));
  EXPECT_TRUE(Contains(Bad("unix:///r.sock?db=x").message(), "db=NUMBER"));
  EXPECT_TRUE(Contains(Bad("unix:///" + std::string(120, 'x')).message(), "longer than 107"));
  std::string password;
  EXPECT_EQ(StripRedisPassword("unix://:s3cret@/tmp/r.sock", &password), "unix:///tmp/r.sock");
  EXPECT_EQ(password, "s3cret");
  EXPECT_EQ(RedactRedisUrl("unix://u:s3cret@/tmp/r.sock"), "unix://u:***@/tmp/r.sock");
  // A path with ':' and '@' in it holds no password.
  EXPECT_EQ(RedactRedisUrl("unix:///tmp/x:y@z.sock"), "unix:///tmp/x:y@z.sock");
  EXPECT_EQ(StripRedisPassword("unix:///tmp/x:y@z.sock", &password), "unix:///tmp/x:y@z.sock");
  EXPECT_EQ(password, "");
}

TEST(RedisUrlTest, BadFormsSayWhatIsWrongWithoutThePassword) {
  EXPECT_TRUE(Contains(Bad("http://u:s3cret@h:1").message(), "unknown scheme"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:0").message(), "bad port"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:65536").message(), "bad port"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:").message(), "bad port"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:x1").message(), "bad port"));
  // USER:PASSWORD without @HOST reads as HOST:PORT[/DB]: when that is no port, nothing from
  // the ':' on is shown, whichever check fails first (a '/' or '?' in the password).
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret").message(), "\"redis://u:***\""));
  EXPECT_TRUE(Contains(Bad("redis://u:s3/cret", "cret").message(), "\"redis://u:***\""));
  EXPECT_TRUE(Contains(Bad("redis://u:s3?cret", "cret").message(), "\"redis://u:***\""));
  EXPECT_TRUE(Contains(Bad("redis://u:99999", "99999").message(), "\"redis://u:***\""));
  EXPECT_TRUE(Contains(Bad("redis://h:1/x", "none").message(), "\"redis://h:1/x\""));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:1/x").message(), "bad database"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:1/-1").message(), "bad database"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@:1").message(), "no host"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3cret@h:1?db=2").message(), "query"));
  EXPECT_TRUE(Contains(Bad("redis://u:s3%zzcret@h:1", "s3%zzcret").message(), "%-escape"));
  EXPECT_TRUE(Contains(Bad("redis://u%4:s3cret@h:1").message(), "%-escape in the user"));
  // Each message shows the URL, its password replaced, and the form wanted.
  const Status s = Bad("redis://u:s3cret@h:1/x");
  EXPECT_TRUE(Contains(s.message(), "redis://u:***@h:1/x")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "redis[s]://[USER[:PASSWORD]@]HOST:PORT[/DB]"));
}

TEST(RedisUrlTest, RedactionAndStripping) {
  EXPECT_EQ(RedactRedisUrl("rediss://u:s3cret@h:1/2"), "rediss://u:***@h:1/2");
  EXPECT_EQ(RedactRedisUrl("redis://:s3cret@h:1"), "redis://:***@h:1");
  EXPECT_EQ(RedactRedisUrl("redis://u:p@ss@h:1"), "redis://u:***@h:1");
  EXPECT_EQ(RedactRedisUrl("redis://u@h:1"), "redis://u@h:1");  // nothing to hide
  EXPECT_EQ(RedactRedisUrl("redis://h:1/0"), "redis://h:1/0");
  EXPECT_EQ(RedactRedisUrl("not a url : s3cret @ x"), "not a url :***@ x");  // unparsable too
  EXPECT_EQ(Parse("redis://u:s3cret@h:1").Describe(), "redis://u:***@h:1");
  EXPECT_EQ(Parse("redis://:s3cret@h:1").Describe(), "redis://:***@h:1");
  EXPECT_EQ(Parse("redis://h:1/5").Describe(), "redis://h:1/5");

  std::string password;
  EXPECT_EQ(StripRedisPassword("rediss://u:p%40ss@h:1/2", &password), "rediss://u@h:1/2");
  EXPECT_EQ(password, "p@ss");
  EXPECT_EQ(StripRedisPassword("redis://:s3cret@h:1", &password), "redis://h:1");
  EXPECT_EQ(password, "s3cret");
  EXPECT_EQ(StripRedisPassword("redis://u@h:1", &password), "redis://u@h:1");
  EXPECT_EQ(password, "");
}

TEST(RedisUrl, Parses) {
  RedisEndpoint ep;
  ASSERT_TRUE(ParseRedisUrl("redis://10.0.0.1:7000/2", &ep).ok());
  EXPECT_EQ(ep.host, "10.0.0.1");
  EXPECT_EQ(ep.port, 7000);
  EXPECT_EQ(ep.db, 2);
  RedisEndpoint ep2;
  ASSERT_TRUE(ParseRedisUrl("localhost:6380", &ep2).ok());
  EXPECT_EQ(ep2.port, 6380);
  EXPECT_FALSE(ParseRedisUrl("redis://host:notaport", &ep2).ok());
}

// ---- ResolveRedisEndpoint -------------------------------------------------------------------

class ResolveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testutil::TempDir();
    certs_ = new testutil::TestCertificates(testutil::MakeTestCertificates(dir_->path()));
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete dir_;
  }
  std::string File(const std::string& name, const std::string& text) {
    const std::string path = dir_->path() + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
  }
  static testutil::TempDir* dir_;
  static testutil::TestCertificates* certs_;
};
testutil::TempDir* ResolveTest::dir_ = nullptr;
testutil::TestCertificates* ResolveTest::certs_ = nullptr;

TEST_F(ResolveTest, PasswordFromAFile) {
  RedisAccessFiles files;
  files.password_file = File("pw", "s3cret\n");  // the trailing newline is not the password
  RedisEndpoint ep;
  ASSERT_TRUE(ResolveRedisEndpoint("redis://ferry-worker@h:1", files, &ep).ok());
  EXPECT_EQ(ep.user, "ferry-worker");
  EXPECT_EQ(ep.password, "s3cret");
  files.password_file = File("pw-crlf", "s3cret\r\n");
  ASSERT_TRUE(ResolveRedisEndpoint("redis://h:1", files, &ep).ok());
  EXPECT_EQ(ep.password, "s3cret");
  EXPECT_EQ(ep.UserName(), "default");
}

TEST_F(ResolveTest, BadPasswordFiles) {
  RedisAccessFiles files;
  RedisEndpoint ep;
  files.password_file = dir_->path() + "/missing";
  Status s = ResolveRedisEndpoint("redis://u@h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "--redis-password-file")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "missing")) << s.message();
  files.password_file = File("empty", "\n");
  s = ResolveRedisEndpoint("redis://u@h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "empty")) << s.message();
  files.password_file = File("two-lines", "s3cret\nother\n");
  s = ResolveRedisEndpoint("redis://u@h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "more than one line")) << s.message();
  EXPECT_FALSE(Contains(s.message(), "s3cret")) << s.message();
}

TEST_F(ResolveTest, ThePasswordGivenTwiceOrNotAtAll) {
  RedisAccessFiles files;
  files.password_file = File("pw2", "s3cret");
  RedisEndpoint ep;
  Status s = ResolveRedisEndpoint("redis://u:other@h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "given twice")) << s.message();
  EXPECT_FALSE(Contains(s.message(), "other")) << s.message();
  // A user without a password would silently be the default user: refused.
  s = ResolveRedisEndpoint("redis://ferry-producer@h:1", RedisAccessFiles{}, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "ferry-producer")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "--redis-password-file")) << s.message();
}

TEST_F(ResolveTest, TlsFilesLoad) {
  RedisAccessFiles files;
  files.tls_ca = certs_->ca;
  files.tls_cert = certs_->client_cert;
  files.tls_key = certs_->client_key;
  RedisEndpoint ep;
  const Status s = ResolveRedisEndpoint("rediss://127.0.0.1:6379", files, &ep);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(ep.tls);
  EXPECT_EQ(ep.tls_ca, certs_->ca);
  EXPECT_EQ(ep.tls_cert, certs_->client_cert);
  EXPECT_EQ(ep.tls_key, certs_->client_key);
  // The CA alone (a Redis without tls-auth-clients) is fine too.
  RedisAccessFiles ca_only;
  ca_only.tls_ca = certs_->ca;
  EXPECT_TRUE(ResolveRedisEndpoint("rediss://127.0.0.1:6379", ca_only, &ep).ok());
}

TEST_F(ResolveTest, TlsFilesNeedRediss) {
  RedisAccessFiles files;
  files.tls_ca = certs_->ca;
  RedisEndpoint ep;
  const Status s = ResolveRedisEndpoint("redis://u:s3cret@127.0.0.1:6379", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "rediss://")) << s.message();
  EXPECT_FALSE(Contains(s.message(), "s3cret")) << s.message();
  // A Unix-domain socket is local: no TLS over it.
  EXPECT_EQ(ResolveRedisEndpoint("unix:///tmp/r.sock", files, &ep).code(), codes::kInvalidArgument);
}

TEST_F(ResolveTest, BadTlsFiles) {
  RedisEndpoint ep;
  RedisAccessFiles files;
  files.tls_ca = File("junk-ca.pem", "this is not a certificate\n");
  Status s = ResolveRedisEndpoint("rediss://h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "--redis-tls-ca")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "junk-ca.pem")) << s.message();

  files.tls_ca = dir_->path() + "/no-such-ca.pem";
  s = ResolveRedisEndpoint("rediss://h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "--redis-tls-ca")) << s.message();

  files.tls_ca = certs_->ca;
  files.tls_cert = certs_->client_cert;
  s = ResolveRedisEndpoint("rediss://h:1", files, &ep);  // a certificate without its key
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "go together")) << s.message();

  files.tls_key =
      File("junk.key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
  s = ResolveRedisEndpoint("rediss://h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "--redis-tls-key")) << s.message();

  files.tls_key = certs_->server_key;  // a real key, but not the certificate's
  s = ResolveRedisEndpoint("rediss://h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "does not match")) << s.message();

  files.tls_cert =
      File("junk.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  files.tls_key = certs_->client_key;
  s = ResolveRedisEndpoint("rediss://h:1", files, &ep);
  EXPECT_EQ(s.code(), codes::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "--redis-tls-cert")) << s.message();
}

}  // namespace
}  // namespace ferry::protocol
