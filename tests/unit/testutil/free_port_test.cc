// tests/testutil's FreePort, which every test that starts a server depends on.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include "process.h"  // tests/testutil

namespace ferry::testutil {
namespace {

// The kernel's ephemeral range.
std::pair<int, int> EphemeralRange() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  file >> low >> high;
  return {low, high};
}

// Ports are distinct within a process, outside the range connect() takes local ports from, and
// bindable (a listening socket on each).
TEST(FreePortTest, DistinctBindablePortsOutsideTheEphemeralRange) {
  const auto [low, high] = EphemeralRange();
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) {
    const int port = FreePort();
    EXPECT_GE(port, 10000);
    EXPECT_LE(port, 65535);
    EXPECT_TRUE(port < low || port > high) << port << " is in the ephemeral range";
    EXPECT_TRUE(seen.insert(port).second) << "port " << port << " handed out twice";
  }
  // Ports something listens on are never handed out: listen on the ten after the last one
  // (where a walk from it would go next), then ask for ten more.
  const int last = FreePort();
  std::vector<int> fds;
  std::set<int> taken;
  for (int port = last + 1; port <= last + 10 && (port < low || port > high) && port <= 65535;
       ++port) {
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
  if (taken.empty()) GTEST_SKIP() << "no free port after " << last << " to listen on";
  for (int i = 0; i < 10; ++i) {
    const int port = FreePort();
    EXPECT_EQ(taken.count(port), 0u) << "handed out port " << port << ", which is listened on";
  }
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace ferry::testutil
