// The worker's Outbox (gpu-worker/src): reports reach the I/O thread in order, a sleeping I/O
// thread is woken through the eventfd and a busy one is not, Push blocks while the outbox is full
// and Close releases it.
#include "outbox.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "process.h"  // testutil: WaitFor

namespace ferry::worker {
namespace {

DoneReport Report(const std::string& id) {
  DoneReport r;
  r.ids.push_back(id);
  return r;
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST(OutboxTest, ReportsComeInOrderWithTheReadyRequest) {
  Outbox outbox(8);
  ASSERT_TRUE(outbox.Init().ok());
  ASSERT_TRUE(outbox.Push(Report("a")));
  outbox.RequestReady();
  ASSERT_TRUE(outbox.Push(Report("b")));
  std::vector<DoneReport> got;
  bool ready = false;
  outbox.TakeAll(&got, &ready);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].ids[0], "a");
  EXPECT_EQ(got[1].ids[0], "b");
  EXPECT_TRUE(ready);
  got.clear();
  outbox.TakeAll(&got, &ready);
  EXPECT_TRUE(got.empty());
  EXPECT_FALSE(ready);
}

// Only a thread that said it sleeps is woken, once, however many reports come.
TEST(OutboxTest, WakesTheThreadOnlyWhileItSleeps) {
  Outbox outbox(8);
  ASSERT_TRUE(outbox.Init().ok());
  ASSERT_TRUE(outbox.Push(Report("awake")));  // the thread is busy: no wake-up
  EXPECT_FALSE(Readable(outbox.fd()));
  EXPECT_FALSE(outbox.Sleeping()) << "something waits: the thread must not sleep";
  std::vector<DoneReport> got;
  bool ready = false;
  outbox.TakeAll(&got, &ready);
  ASSERT_TRUE(outbox.Sleeping());
  ASSERT_TRUE(outbox.Push(Report("x")));
  ASSERT_TRUE(outbox.Push(Report("y")));
  EXPECT_TRUE(Readable(outbox.fd()));
  outbox.Awake(Readable(outbox.fd()));  // clears the eventfd
  EXPECT_FALSE(Readable(outbox.fd()));
  outbox.TakeAll(&got, &ready);
  EXPECT_EQ(got.size(), 3u);
}

TEST(OutboxTest, PushBlocksWhileFullAndCloseReleasesIt) {
  Outbox outbox(2);
  ASSERT_TRUE(outbox.Init().ok());
  ASSERT_TRUE(outbox.Push(Report("1")));
  ASSERT_TRUE(outbox.Push(Report("2")));
  std::atomic<int> pushed{0};
  std::thread third([&] {
    if (outbox.Push(Report("3"))) ++pushed;
  });
  std::vector<DoneReport> got;
  bool ready = false;
  outbox.TakeAll(&got, &ready);  // room again: the third goes in
  ASSERT_TRUE(testutil::WaitFor([&] { return pushed.load() == 1; }));
  third.join();
  ASSERT_TRUE(outbox.Push(Report("4")));
  std::atomic<bool> returned{false}, accepted{true};
  std::thread fifth([&] {
    accepted = outbox.Push(Report("5"));  // full (3, 4): blocks until Close
    returned = true;
  });
  outbox.Close();
  fifth.join();
  EXPECT_TRUE(returned);
  EXPECT_FALSE(accepted) << "a closed outbox drops what comes";
}

}  // namespace
}  // namespace ferry::worker
