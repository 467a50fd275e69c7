// The pieces `ferry up` decides with, on real sockets, files and processes: whether a port is
// free, whether a given process is the one listening on it (readiness must come from the broker
// it started), the CURVE keys it makes, and the log lines it shows when a child dies.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>

#include "fleet.h"
#include "local_fleet.h"
#include "process.h"

namespace ferry::cli {
namespace {

using testutil::FileMode;
using testutil::FreePort;
using testutil::ReadFile;
using testutil::TempDir;

// A listening TCP socket on 127.0.0.1:port, closed on destruction.
class Listener {
 public:
  explicit Listener(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // not inherited by the broker
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ok_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 4) == 0;
  }
  ~Listener() { close(fd_); }
  bool ok() const { return ok_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

TEST(LocalFleet, PortFreeSeesAListenerOnTheAddressAndOnAllInterfaces) {
  const int port = FreePort();
  EXPECT_TRUE(PortFree("127.0.0.1", port));
  {
    Listener l(port);
    ASSERT_TRUE(l.ok());
    EXPECT_FALSE(PortFree("127.0.0.1", port));
    EXPECT_FALSE(PortFree("*", port)) << "a wildcard bind collides with it too";
  }
  EXPECT_TRUE(PortFree("127.0.0.1", port));
}

TEST(LocalFleet, ProcessListensOnTellsWhichProcessHoldsThePort) {
  const int port = FreePort(), other = FreePort();
  Listener l(port);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(ProcessListensOn(getpid(), port));
  EXPECT_FALSE(ProcessListensOn(getpid(), other));
  // A real broker: it holds its ports, and we do not hold them.
  TempDir dir;
  testutil::RedisServer redis;
  const int frontend = FreePort(), backend = FreePort();
  testutil::Process broker(
      {testutil::BrokerBin(), "--frontend", "tcp://127.0.0.1:" + std::to_string(frontend),
       "--backend", "tcp://127.0.0.1:" + std::to_string(backend), "--redis", redis.url()},
      dir.path() + "/broker.log");
  ASSERT_TRUE(testutil::WaitFor([&] {
    return ProcessListensOn(broker.pid(), frontend) && ProcessListensOn(broker.pid(), backend);
  })) << broker.Log();
  EXPECT_FALSE(ProcessListensOn(getpid(), frontend));
  EXPECT_FALSE(ProcessListensOn(broker.pid(), port)) << "our listener is not the broker's";
}

TEST(LocalFleet, FleetKeysAreMadeOnceWithSecretsReadableByTheOwnerOnly) {
  TempDir dir;
  const std::string keys_dir = dir.path() + "/keys";
  FleetKeys k;
  ASSERT_TRUE(PrepareFleetKeys(keys_dir, 2, &k).ok());
  EXPECT_EQ(FileMode(keys_dir), 0700);
  for (const std::string& secret :
       {k.broker_secret, k.producer_secret, k.worker_secrets.at(0), k.worker_secrets.at(1)})
    EXPECT_EQ(FileMode(secret), 0600) << secret;
  EXPECT_EQ(k.worker_secrets.size(), 2u);
  EXPECT_EQ(ReadFile(k.allow_producers + "/producer.key"), ReadFile(k.producer_public));
  EXPECT_EQ(ReadFile(k.allow_workers + "/worker1.key"), ReadFile(keys_dir + "/worker1.key"));
  EXPECT_EQ(FileMode(k.allow_workers + "/worker1.key_secret"), -1);
  EXPECT_EQ(FileMode(k.allow_producers + "/broker.key"), -1) << "the broker is no producer";

  // Again, with a third worker: the pairs that exist are kept, the new one is made.
  const std::string broker_secret = ReadFile(k.broker_secret);
  FleetKeys again;
  ASSERT_TRUE(PrepareFleetKeys(keys_dir, 3, &again).ok());
  EXPECT_EQ(ReadFile(again.broker_secret), broker_secret);
  EXPECT_EQ(FileMode(again.worker_secrets.at(2)), 0600);

  // A broken kept secret is an error naming the file, not silently replaced.
  std::ofstream(k.producer_secret, std::ios::trunc) << "junk\n";
  FleetKeys broken;
  const Status s = PrepareFleetKeys(keys_dir, 1, &broken);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("producer.key_secret"), std::string::npos) << s.ToString();
}

TEST(LocalFleet, TailLinesShowsTheLastLinesWithoutControlCharacters) {
  TempDir dir;
  const std::string log = dir.path() + "/child.log";
  {
    std::ofstream out(log);
    for (int i = 1; i <= 30; ++i) out << "line " << i << "\n";
    out << "evil \x1b[2Jclear\n";
  }
  const std::string tail = TailLines(log, 3, "  ");
  EXPECT_EQ(tail, "  line 29\n  line 30\n  evil ?[2Jclear\n");
  EXPECT_NE(TailLines(dir.path() + "/none.log", 3, "").find("no log"), std::string::npos);
}

}  // namespace
}  // namespace ferry::cli
