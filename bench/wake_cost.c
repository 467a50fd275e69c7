// What a system call and a thread wake-up cost on this machine: the floor under Ferry's
// light-load latency, where one job crosses ~19 thread hand-offs (see docs/performance.md).
//   cc -O2 -o /tmp/wake_cost bench/wake_cost.c -lpthread && /tmp/wake_cost
// Prints the cost of getpid(2) (a bare system call) and of a round trip between two threads
// that wake each other through eventfds and poll(2), as ZeroMQ's mailboxes do.
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { kSyscalls = 200000, kRoundTrips = 20000 };
static int ping_fd, pong_fd;

static double NowNs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void* Pong(void* arg) {
  (void)arg;
  uint64_t v;
  for (int i = 0; i < kRoundTrips; i++) {
    struct pollfd p = {ping_fd, POLLIN, 0};
    poll(&p, 1, -1);
    if (read(ping_fd, &v, 8) != 8) return NULL;
    v = 1;
    if (write(pong_fd, &v, 8) != 8) return NULL;
  }
  return NULL;
}

int main(void) {
  double t = NowNs();
  for (int i = 0; i < kSyscalls; i++) syscall(SYS_getpid);
  printf("system call (getpid): %.0f ns\n", (NowNs() - t) / kSyscalls);
  ping_fd = eventfd(0, 0);
  pong_fd = eventfd(0, 0);
  pthread_t th;
  pthread_create(&th, NULL, Pong, NULL);
  uint64_t v = 1;
  t = NowNs();
  for (int i = 0; i < kRoundTrips; i++) {
    if (write(ping_fd, &v, 8) != 8) return 1;
    struct pollfd p = {pong_fd, POLLIN, 0};
    poll(&p, 1, -1);
    if (read(pong_fd, &v, 8) != 8) return 1;
  }
  const double rt = (NowNs() - t) / kRoundTrips;
  printf("thread wake round trip: %.0f ns (one hand-off: %.0f ns)\n", rt, rt / 2);
  pthread_join(th, NULL);
  return 0;
}
