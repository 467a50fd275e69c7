// tests/testutil's FreePort, which every test that starts a server depends on.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <vector>

#include "process.h"  // tests/testutil

namespace ferry::testutil {
namespace {

int EphemeralLowForTest() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (range >> low >> high && low > 12000) return low;
  return 32768;
}

// Ports are distinct within a process, below the range connect() takes local ports from, and
// bindable (a listening socket on each).
TEST(FreePortTest, DistinctBindablePortsBelowTheEphemeralRange) {
  const int low = EphemeralLowForTest();
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) {
    const int port = FreePort();
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, low);
    EXPECT_TRUE(seen.insert(port).second) << "port " << port << " handed out twice";
  }
  // Ports something listens on are never handed out: listen on the ten after the last one
  // (where a walk from it would go next), then ask for ten more.
  const int last = FreePort();
  std::vector<int> fds;
  std::set<int> taken;
  for (int port = last + 1; port <= last + 10 && port < low; ++port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0) {
      taken.insert(port);
      fds.push_back(fd);
    } else {
      close(fd);  // someone else's already: just as taken
    }
  }
  for (int i = 0; i < 10; ++i) {
    const int port = FreePort();
    EXPECT_EQ(taken.count(port), 0u) << "handed out port " << port << ", which is listened on";
  }
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace ferry::testutil
