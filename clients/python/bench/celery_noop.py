"""For scale: Celery's client on no-op tasks, with Redis as its broker and result backend.

    python3 clients/python/bench/celery_noop.py --redis redis://127.0.0.1:6379/1 \
        [--jobs 5000] [--latency-jobs 1000] [--concurrency 1] [--worker-args "-P prefork -c 2"]

Starts a Celery worker (a subprocess running this file's app) on the given Redis, then measures
from this process: `noop.delay(x).get()` one at a time (latency percentiles), and `--jobs`
`apply_async` calls followed by `.get()` of each (throughput). The task returns its argument (8
floats), as Ferry's `tiny` returns 8. Prints one JSON line. Figures only: not a test.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from celery import Celery

REDIS = os.environ.get("CELERY_NOOP_REDIS", "redis://127.0.0.1:6379/1")
app = Celery("celery_noop", broker=REDIS, backend=REDIS)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="noop")
def noop(x):
    return x


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100.0 * len(values))) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis", default=REDIS)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--latency-jobs", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8, help="threads for the throughput run")
    ap.add_argument("--worker-args", default="-P prefork -c 2")
    args = ap.parse_args()
    env = dict(os.environ, CELERY_NOOP_REDIS=args.redis)
    here = os.path.dirname(os.path.abspath(__file__))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_noop", "worker", "-l", "warning",
         "--without-gossip", "--without-mingle", "--without-heartbeat"] + args.worker_args.split(),
        cwd=here, env=env)
    app.conf.broker_url = app.conf.result_backend = args.redis
    try:
        x = [0.5] * 8
        deadline = time.monotonic() + 60
        while True:  # the worker is up once a task comes back
            try:
                noop.delay(x).get(timeout=1)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise SystemExit("celery worker did not answer within 60 s")
        for _ in range(100):
            noop.delay(x).get(timeout=30)
        lat = []
        for _ in range(args.latency_jobs):
            t = time.perf_counter()
            noop.delay(x).get(timeout=30)
            lat.append((time.perf_counter() - t) * 1e3)
        left = [args.jobs]
        lock = threading.Lock()

        def loader():
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    n = min(64, left[0])
                    left[0] -= n
                rs = [noop.apply_async((x,)) for _ in range(n)]
                for r in rs:
                    r.get(timeout=120)
        t = time.perf_counter()
        threads = [threading.Thread(target=loader) for _ in range(args.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        seconds = time.perf_counter() - t
        print(json.dumps({"system": "celery", "celery_worker": args.worker_args,
                          "latency_p50_ms": pct(lat, 50), "latency_p90_ms": pct(lat, 90),
                          "latency_p99_ms": pct(lat, 99), "jobs": args.jobs,
                          "throughput": args.jobs / seconds, "loaders": args.concurrency}))
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
