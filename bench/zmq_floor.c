// The transport floor under Ferry's light-load latency: bare libzmq with Ferry's shape and no
// Ferry code (docs/performance.md, "Result notices straight from the worker"). Three processes:
//   cc -O2 -o /tmp/zmq_floor bench/zmq_floor.c -lzmq
//   /tmp/zmq_floor relay tcp://127.0.0.1:7001 tcp://127.0.0.1:7002 &   # ROUTER/DEALER proxy
//   /tmp/zmq_floor echo tcp://127.0.0.1:7002 &                         # REP: answers at once
//   /tmp/zmq_floor client tcp://127.0.0.1:7001 5000                    # REQ: p50/p90/p99
// A round trip client -> relay -> echo -> relay -> client is four messages, as SUBMIT, CHUNK,
// DONE and FINISHED were. `client URL N direct` talks to a ROUTER echo without the relay:
//   /tmp/zmq_floor router-echo tcp://127.0.0.1:7003 &
//   /tmp/zmq_floor client tcp://127.0.0.1:7003 5000 direct
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static double NowUs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int Compare(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: zmq_floor relay FRONT BACK | echo URL | router-echo URL | "
            "client URL N [direct]\n");
    return 2;
  }
  void* ctx = zmq_ctx_new();
  char buf[256];
  if (!strcmp(argv[1], "relay") && argc >= 4) {
    void* front = zmq_socket(ctx, ZMQ_ROUTER);
    void* back = zmq_socket(ctx, ZMQ_DEALER);
    if (zmq_bind(front, argv[2]) || zmq_bind(back, argv[3])) return 1;
    zmq_proxy(front, back, NULL);
    return 0;
  }
  if (!strcmp(argv[1], "echo")) {
    void* s = zmq_socket(ctx, ZMQ_REP);
    if (zmq_connect(s, argv[2])) return 1;
    for (;;) {
      int n = zmq_recv(s, buf, sizeof(buf), 0);
      if (n < 0) return 1;
      zmq_send(s, buf, n > (int)sizeof(buf) ? sizeof(buf) : (size_t)n, 0);
    }
  }
  if (!strcmp(argv[1], "router-echo")) {
    void* s = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(s, argv[2])) return 1;
    char id[256];
    for (;;) {
      int n = zmq_recv(s, id, sizeof(id), 0);
      int m = zmq_recv(s, buf, sizeof(buf), 0);
      if (n < 0 || m < 0) return 1;
      zmq_send(s, id, n, ZMQ_SNDMORE);
      zmq_send(s, buf, m > (int)sizeof(buf) ? sizeof(buf) : (size_t)m, 0);
    }
  }
  if (!strcmp(argv[1], "client") && argc >= 4) {
    const int direct = argc > 4 && !strcmp(argv[4], "direct");
    void* s = zmq_socket(ctx, direct ? ZMQ_DEALER : ZMQ_REQ);
    if (zmq_connect(s, argv[2])) return 1;
    const int n = atoi(argv[3]);
    if (n <= 0) return 2;
    double* lat = malloc(sizeof(double) * n);
    memset(buf, 'x', 32);
    for (int i = 0; i < 200; ++i) {  // warm-up
      zmq_send(s, buf, 32, 0);
      zmq_recv(s, buf, sizeof(buf), 0);
    }
    for (int i = 0; i < n; ++i) {
      double t = NowUs();
      zmq_send(s, buf, 32, 0);
      zmq_recv(s, buf, sizeof(buf), 0);
      lat[i] = NowUs() - t;
    }
    qsort(lat, n, sizeof(double), Compare);
    printf("round trip us: p50 %.1f p90 %.1f p99 %.1f\n", lat[n / 2], lat[n * 9 / 10],
           lat[n * 99 / 100]);
    free(lat);
    return 0;
  }
  fprintf(stderr, "zmq_floor: unknown mode %s\n", argv[1]);
  return 2;
}
