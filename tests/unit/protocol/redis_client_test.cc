// protocol::RedisClient against a real redis-server: a pipeline of commands whose arguments are
// binary (CR LF and NUL inside, empty, one of several MB) goes out in one round trip and every
// reply comes back in order; an error reply in the middle is reported without losing the others;
// a database Redis refuses is never silently replaced by database 0.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/protocol/redis.h"
#include "process.h"

namespace ferry::protocol {
namespace {

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Ping());
    RedisEndpoint ep;
    ASSERT_TRUE(ParseRedisUrl(server_.url(), &ep).ok());
    ASSERT_TRUE(RedisClient::Connect(ep, 5000, &client_).ok());
  }
  testutil::RedisServer server_;
  std::unique_ptr<RedisClient> client_;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  return s;
}

TEST_F(RedisClientTest, PipelinedBinaryArgumentsArriveByteForByte) {
  const std::string crlf = std::string("a\r\nb\0c\r\n", 8);
  const std::string big = Pattern((size_t{3} << 20) + 17);
  client_->Append({"SET", "k:crlf", crlf});
  client_->Append({"SET", "k:empty", ""});
  client_->Append({"SET", std::string("k:\r\n\0", 5), big});
  client_->Append({"MGET", "k:crlf", "k:empty", std::string("k:\r\n\0", 5), "k:missing"});
  EXPECT_EQ(client_->pending(), 4u);
  std::vector<RedisReply> replies;
  ASSERT_TRUE(client_->Flush(&replies).ok());
  EXPECT_EQ(client_->pending(), 0u);
  ASSERT_EQ(replies.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(replies[i].str, "OK") << i;
  const auto& got = replies[3].elements;
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].str, crlf);
  EXPECT_EQ(got[1].type, RedisReply::Type::kString);
  EXPECT_EQ(got[1].str, "");
  EXPECT_EQ(got[2].str.size(), big.size());
  EXPECT_TRUE(got[2].str == big) << "the big value came back changed";
  EXPECT_EQ(got[3].type, RedisReply::Type::kNil);
}

TEST_F(RedisClientTest, AnErrorReplyInThePipelineKeepsTheOthersInOrder) {
  client_->Append({"SET", "k:n", "1"});
  client_->Append({"LPUSH", "k:n", "x"});  // WRONGTYPE
  client_->Append({"INCRBY", "k:n", "41"});
  std::vector<RedisReply> replies;
  ASSERT_TRUE(client_->Flush(&replies).ok());
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[1].type, RedisReply::Type::kError);
  EXPECT_NE(replies[1].str.find("WRONGTYPE"), std::string::npos) << replies[1].str;
  EXPECT_EQ(replies[2].integer, 42);
  // Without a reply vector the first error becomes the status; the connection stays usable.
  client_->Append({"LPUSH", "k:n", "x"});
  EXPECT_EQ(client_->Flush(nullptr).code(), codes::kInternal);
  RedisReply reply;
  ASSERT_TRUE(client_->Command({"GET", "k:n"}, &reply).ok());
  EXPECT_EQ(reply.str, "42");
}

// An error reply that goes away by itself (here OOM: Redis at maxmemory) fails a call as
// unavailable -- retried by callers, as Redis down is -- and one that never will (WRONGTYPE) as
// internal; in Flush without replies, in Command and in GetMany alike.
TEST_F(RedisClientTest, AnErrorReplyThatPassesIsUnavailableOneThatDoesNotInternal) {
  RedisReply reply;
  ASSERT_TRUE(client_->Command({"SET", "k:n", "1"}, &reply).ok());
  ASSERT_TRUE(client_->Command({"CONFIG", "SET", "maxmemory", "1"}, &reply).ok());
  Status s = client_->Command({"SET", "k:m", "2"}, &reply);
  EXPECT_EQ(s.code(), codes::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("OOM"), std::string::npos) << s.message();
  client_->Append({"SET", "k:m", "2"});
  EXPECT_EQ(client_->Flush(nullptr).code(), codes::kUnavailable);
  ASSERT_TRUE(client_->Command({"CONFIG", "SET", "maxmemory", "0"}, &reply).ok());
  EXPECT_EQ(client_->Command({"LPUSH", "k:n", "x"}, &reply).code(), codes::kInternal);
  ASSERT_TRUE(client_->Command({"LPUSH", "k:list", "x"}, &reply).ok());
  std::vector<std::optional<std::string>> values;
  EXPECT_EQ(client_->GetMany({"k:list"}, &values).code(), codes::kInternal);  // WRONGTYPE
}

TEST_F(RedisClientTest, AFlushWithNothingAppendedSendsNothing) {
  std::vector<RedisReply> replies{RedisReply{}};
  EXPECT_TRUE(client_->Flush(&replies).ok());
  EXPECT_TRUE(replies.empty());
  server_.Stop();  // nothing is sent, so a dead server is not noticed
  EXPECT_TRUE(client_->Flush(nullptr).ok());
  client_->Append({"PING"});
  EXPECT_EQ(client_->Flush(nullptr).code(), codes::kUnavailable);
  EXPECT_EQ(client_->pending(), 0u) << "a failed flush drops what it could not send";
}

TEST_F(RedisClientTest, AnEmptyCommandIsIgnored) {
  client_->Append({});
  client_->Append({"PING"});
  EXPECT_EQ(client_->pending(), 1u);
  std::vector<RedisReply> replies;
  ASSERT_TRUE(client_->Flush(&replies).ok());
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].str, "PONG");
}

// A database Redis refuses to SELECT fails every command, not only the first: the connection
// is not kept on database 0.
TEST_F(RedisClientTest, ARefusedSelectFailsEveryTryInsteadOfUsingDatabaseZero) {
  RedisEndpoint ep;
  ASSERT_TRUE(ParseRedisUrl(server_.url() + "/99", &ep).ok());  // 16 databases by default
  ASSERT_EQ(ep.db, 99);
  auto lazy = RedisClient::Lazy(ep, 5000);
  for (int attempt = 0; attempt < 2; ++attempt) {
    RedisReply reply;
    EXPECT_FALSE(lazy->Command({"SET", "k:db", "v"}, &reply).ok()) << "attempt " << attempt;
  }
  RedisReply reply;
  ASSERT_TRUE(client_->Command({"EXISTS", "k:db"}, &reply).ok());
  EXPECT_EQ(reply.integer, 0) << "the SET went to database 0";
}

// GetManyInto: each value lands where the caller's function says (here: back to back in one
// buffer), nothing is asked for a missing key, and an error reply fails the call without
// leaving the connection out of step.
TEST_F(RedisClientTest, GetManyIntoReadsEachValueWhereTheCallerSays) {
  const std::string big = Pattern((size_t{1} << 20) + 5);
  client_->Append({"SET", "k:big", big});
  client_->Append({"SET", "k:small", "abc"});
  client_->Append({"SET", "k:empty", ""});
  client_->Append({"LPUSH", "k:list", "x"});
  ASSERT_TRUE(client_->Flush(nullptr).ok());
  std::vector<char> buffer(big.size() + 3 + 64, '#');
  std::vector<std::pair<size_t, size_t>> asked;  // (index, size)
  size_t used = 0;
  auto into = [&](size_t i, size_t size) {
    asked.emplace_back(i, size);
    char* at = buffer.data() + used;
    used += size;
    return at;
  };
  std::vector<bool> found;
  Status s = client_->GetManyInto({"k:small", "k:missing", "k:big", "k:empty"}, into, &found);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(found, std::vector<bool>({true, false, true, true}));
  EXPECT_EQ(asked, (std::vector<std::pair<size_t, size_t>>{{0, 3}, {2, big.size()}, {3, 0}}));
  EXPECT_EQ(std::string(buffer.data(), 3), "abc");
  EXPECT_TRUE(std::string(buffer.data() + 3, big.size()) == big) << "the big value changed";
  EXPECT_EQ(buffer[3 + big.size()], '#');  // nothing written past what was asked for

  used = 0;
  s = client_->GetManyInto({"k:small", "k:list"}, into, &found);
  EXPECT_EQ(s.code(), codes::kInternal);
  EXPECT_NE(s.message().find("WRONGTYPE"), std::string::npos) << s.message();
  std::string value;
  bool there = false;
  ASSERT_TRUE(client_->Get("k:small", &value, &there).ok());
  EXPECT_TRUE(there);
  EXPECT_EQ(value, "abc");
}

// With `errors`, an error reply (WRONGTYPE) is that key's alone: the call succeeds, the other
// values land where they should, and the connection stays in step.
TEST_F(RedisClientTest, GetManyIntoReportsAnErrorReplyPerKey) {
  const std::string big = Pattern((size_t{1} << 20) + 5);
  client_->Append({"SET", "k:big", big});
  client_->Append({"SET", "k:small", "abc"});
  client_->Append({"LPUSH", "k:list", "x"});
  ASSERT_TRUE(client_->Flush(nullptr).ok());
  std::vector<std::string> values(4);
  auto into = [&](size_t i, size_t size) {
    values[i].resize(size);
    return values[i].data();
  };
  std::vector<bool> found;
  std::vector<std::string> errors;
  Status s = client_->GetManyInto({"k:small", "k:list", "k:big", "k:missing"}, into, &found,
                                  /*consume=*/false, &errors);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(found, std::vector<bool>({true, false, true, false}));
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1].rfind("WRONGTYPE", 0), 0u) << errors[1];
  EXPECT_EQ(errors[2], "");
  EXPECT_EQ(errors[3], "");
  EXPECT_EQ(values[0], "abc");
  EXPECT_TRUE(values[2] == big) << "the big value changed";
  std::string value;
  bool there = false;
  ASSERT_TRUE(client_->Get("k:small", &value, &there).ok());
  EXPECT_EQ(value, "abc");
}

// A Destination that returns null has that value skipped: read through a small buffer and
// dropped, never written anywhere; the values after it still land, and the connection stays
// in step (a value longer than the caller expected costs no memory).
TEST_F(RedisClientTest, GetManyIntoSkipsAValueItsDestinationDiscards) {
  const std::string big = Pattern((size_t{3} << 20) + 11);  // more than the reader stages
  client_->Append({"SET", "k:big", big});
  client_->Append({"SET", "k:small", "abc"});
  client_->Append({"SET", "k:tiny", "xy"});
  ASSERT_TRUE(client_->Flush(nullptr).ok());
  std::string small(3, '#');
  std::vector<std::pair<size_t, size_t>> asked;  // (index, size)
  auto into = [&](size_t i, size_t size) -> char* {
    asked.emplace_back(i, size);
    return i == 1 ? small.data() : nullptr;  // k:big and k:tiny (staged whole) are skipped
  };
  std::vector<bool> found;
  Status s = client_->GetManyInto({"k:big", "k:small", "k:tiny"}, into, &found);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(found, std::vector<bool>({true, true, true}));
  EXPECT_EQ(asked, (std::vector<std::pair<size_t, size_t>>{{0, big.size()}, {1, 3}, {2, 2}}));
  EXPECT_EQ(small, "abc");
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(client_->GetMany({"k:tiny", "k:big"}, &values).ok());
  ASSERT_TRUE(values.at(0).has_value() && values.at(1).has_value());
  EXPECT_EQ(*values[0], "xy");
  EXPECT_TRUE(*values[1] == big) << "the big value came back changed";
}

// A peer that lies about a value's length (here 8 GB: no Ferry value comes near 512 MiB) gets
// a malformed error and the connection is dropped, without the client allocating what it says.
TEST(RedisLyingPeerTest, ABulkLengthOverRedisLimitIsMalformed) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::thread peer([listener] {
    const int conn = accept(listener, nullptr, nullptr);
    if (conn < 0) return;
    char buf[4096];
    ssize_t n;
    while ((n = read(conn, buf, sizeof(buf))) > 0) {
      const std::string got(buf, static_cast<size_t>(n));
      const std::string reply =
          got.find("GET") != std::string::npos ? "$8000000000\r\n" : "+OK\r\n";
      if (write(conn, reply.data(), reply.size()) < 0) break;
    }
    close(conn);
  });
  RedisEndpoint ep;
  ASSERT_TRUE(ParseRedisUrl("redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), &ep).ok());
  std::unique_ptr<RedisClient> client;
  ASSERT_TRUE(RedisClient::Connect(ep, 5000, &client).ok());
  std::vector<std::optional<std::string>> values;
  const Status s = client->GetMany({"k"}, &values);
  EXPECT_EQ(s.code(), codes::kMalformed) << s.ToString();
  EXPECT_NE(s.message().find("over the 512 MiB a Ferry value can be"), std::string::npos)
      << s.ToString();
  EXPECT_FALSE(client->connected());
  client.reset();
  peer.join();
  close(listener);
}

// unix:///PATH?db=N: the same commands over Redis's Unix-domain socket, on that database; a
// big value goes out and comes back whole (GetMany reads it straight from the socket).
TEST(RedisUnixSocketTest, BigValuesRoundTripOnTheNamedDatabase) {
  testutil::RedisServer::Options o;
  o.unix_socket = true;
  testutil::RedisServer server(o);
  RedisEndpoint ep;
  ASSERT_TRUE(ParseRedisUrl(server.unix_url() + "?db=2", &ep).ok());
  std::unique_ptr<RedisClient> client;
  Status s = RedisClient::Connect(ep, 5000, &client);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string big = Pattern((size_t{1} << 20) - 3);
  client->Append({"SET", "k:big", big});
  std::vector<RedisReply> replies;
  ASSERT_TRUE(client->Flush(&replies).ok());
  ASSERT_EQ(replies.at(0).str, "OK");
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(client->GetMany({"k:big", "k:missing"}, &values).ok());
  ASSERT_TRUE(values.at(0).has_value());
  EXPECT_TRUE(*values[0] == big) << "the big value came back changed";
  EXPECT_FALSE(values.at(1).has_value());
  // On database 2, not 0 (seen over TCP).
  auto tcp = server.Connect();
  ASSERT_NE(tcp, nullptr);
  RedisReply reply;
  ASSERT_TRUE(tcp->Command({"EXISTS", "k:big"}, &reply).ok());
  EXPECT_EQ(reply.integer, 0);
  ASSERT_TRUE(tcp->Command({"SELECT", "2"}, &reply).ok());
  ASSERT_TRUE(tcp->Command({"STRLEN", "k:big"}, &reply).ok());
  EXPECT_EQ(reply.integer, static_cast<int64_t>(big.size()));
}

}  // namespace
}  // namespace ferry::protocol
