"""python -m ferry.bench: drives a running Ferry fleet through the Python client and reports
throughput, latency percentiles, the batch-size distribution and where the time went -- the
flags and JSON fields of the C++ ferry-bench where they apply (bench/ferry_bench.cc).

  closed loop  --concurrency C        C jobs in flight: --run: C coroutines (or threads), each
                                      running one job at a time; else --loaders pipelines of
                                      submit_many windows of --submit-batch jobs + wait
  open loop    --rate R               Poisson arrivals, latency from the intended start
  --client async (default): one AsyncClient on one event loop; sync: ferry.Client + threads.
"""

import argparse
import asyncio
import collections
import json
import math
import random
import resource
import sys
import threading
import time

import numpy as np

from . import AsyncClient, Client, DTYPES, FerryError, bfloat16

INPUT_POOL = 64
STAGES = ("submit", "queue", "dispatch", "compute", "delivery")
PARTS = ("submit", "queue", "dispatch", "transfer", "worker", "compute", "delivery")


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def wall_us():
    return time.time() * 1e6


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    rank = math.ceil(p / 100.0 * len(sorted_values))
    return sorted_values[min(max(1, rank) - 1, len(sorted_values) - 1)]


class Recorder:
    """Samples and failures of one run (thread-safe enough: list.append is atomic)."""

    def __init__(self, print_results):
        self.samples = []
        self.failed = 0
        self.print_results = print_results
        self.printed = []
        self.lock = threading.Lock()

    def fail(self, id, err):
        with self.lock:
            self.failed += 1
            if self.failed <= 5:
                print("job %s: %s" % (id, err), file=sys.stderr)

    def rejected(self, err, n):
        """A submit_many of `n` jobs raised `err`: counts the jobs it did not accept as failed
        and returns the ids it did."""
        accepted = getattr(err, "accepted", [])
        for i in getattr(err, "ids", [None] * n):
            if i not in accepted:
                self.fail(i, err)
        return accepted

    def record(self, id, start, start_wall, result, error=None):
        end, end_wall = time.perf_counter(), wall_us()
        if error is not None or result is None or result.status != "done":
            return self.fail(id, error or (result.status, result.error))
        t = result.timing
        s = {"latency_ms": (end - start) * 1e3, "batch_size": result.batch_size,
             "output_bytes": sum(a.nbytes for a in result.outputs)}
        if t.get("submitted") and t.get("compute_end"):
            s["submit"] = t["submitted"] - start_wall
            s["queue"] = t.get("dispatched", 0) - t["submitted"]
            s["dispatch"] = t.get("compute_start", 0) - t.get("dispatched", 0)
            s["transfer"] = t.get("received", 0) - t.get("dispatched", 0)
            s["worker"] = t.get("compute_start", 0) - t.get("received", 0)
            s["compute"] = t["compute_end"] - t.get("compute_start", 0)
            s["delivery"] = end_wall - t["compute_end"]
            s["stages"] = all(t.get(k) for k in ("dispatched", "received", "compute_start"))
        self.samples.append(s)
        if len(self.printed) < self.print_results:
            self.printed.append(result)


def make_inputs(args):
    rng = np.random.default_rng(args.seed)
    dt = DTYPES[args.dtype]
    pool = []
    for _ in range(INPUT_POOL):
        if args.dtype == "bfloat16":  # the bits in uint16: tagged, not a plain uint16 array
            a = bfloat16(rng.uniform(-1, 1, args.shape))
        elif args.dtype.startswith("float"):
            a = rng.uniform(-1, 1, args.shape).astype(np.float32).astype(dt)
        elif args.dtype == "bool":
            a = rng.integers(0, 2, args.shape).astype(bool)
        else:
            a = rng.integers(0, 256, args.shape).astype(dt)
        pool.append(a)
    return pool


# ---- async --------------------------------------------------------------------------------

async def async_closed(client, args, pool, rec):
    jobs = iter(range(args.jobs))
    timeout = args.timeout_ms / 1000.0

    async def runner(k):
        x = pool[(k * 7) % len(pool)]
        for _ in jobs:
            start, start_wall = time.perf_counter(), wall_us()
            try:
                r = await client.run(args.model, x, timeout=timeout)
                rec.record(None, start, start_wall, r)
            except FerryError as e:
                rec.fail(e.id, e)

    async def loader(t, k, batch):
        pending = collections.deque()
        more = True
        slots = [pool[(t * 7 + i) % len(pool)] for i in range(batch)]
        while True:
            free = k - len(pending)
            if more and (free >= batch or not pending):
                n = 0
                for _ in range(min(free, batch)):
                    if next(jobs, None) is None:
                        more = False
                        break
                    n += 1
                if n == 0:
                    continue
                start, start_wall = time.perf_counter(), wall_us()
                window = [{"model": args.model, "inputs": [slots[i]]} for i in range(n)]
                try:
                    ids = await client.submit_many(window)
                except FerryError as e:
                    ids = rec.rejected(e, n)
                pending.extend((i, start, start_wall) for i in ids)
                continue
            if not pending:
                break
            i, start, start_wall = pending.popleft()
            try:
                rec.record(i, start, start_wall, await client.wait(i, timeout))
            except FerryError as e:
                rec.fail(i, e)

    if args.run:
        await asyncio.gather(*[runner(k) for k in range(args.concurrency)])
    else:
        loaders = args.loaders or min(args.concurrency, 4)
        tasks = []
        for t in range(loaders):
            k = args.concurrency // loaders + (1 if t < args.concurrency % loaders else 0)
            batch = max(1, min(k, args.submit_batch or k // 4))
            tasks.append(loader(t, k, batch))
        await asyncio.gather(*tasks)


async def async_open(client, args, pool, rec):
    rng = random.Random(args.seed * 104729)
    loop = asyncio.get_running_loop()
    start, start_wall = time.perf_counter() + 0.005, wall_us() + 5000
    intended, t = [], 0.0
    for _ in range(args.jobs):
        t += rng.expovariate(args.rate)
        intended.append(start + t)
    timeout = args.timeout_ms / 1000.0
    batch = args.submit_batch or 64
    waits = []

    async def finish(i, when):
        try:
            rec.record(i, when, start_wall + (when - start) * 1e6, await client.wait(i, timeout))
        except FerryError as e:
            rec.fail(i, e)

    n = 0
    while n < len(intended):
        delay = intended[n] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        due = []
        while n < len(intended) and intended[n] <= now and len(due) < batch:
            due.append(intended[n])
            n += 1
        window = [{"model": args.model, "inputs": [pool[(n - len(due) + i) % len(pool)]]}
                  for i in range(len(due))]
        try:
            ids = await client.submit_many(window)
        except FerryError as e:
            ids = [i if i in e.accepted else None for i in getattr(e, "ids", [])]
            for i in e.ids:
                if i not in e.accepted:
                    rec.fail(i, e.errors.get(i, e))
        for i, when in zip(ids, due):
            if i is not None:
                waits.append(loop.create_task(finish(i, when)))
    await asyncio.gather(*waits)


async def async_main(args, pool, rec):
    async with AsyncClient(args.frontend, args.redis, **client_options(args)) as client:
        if args.wait_workers:
            await wait_workers_async(client, args.wait_workers)
        if args.warmup:
            w = argparse.Namespace(**vars(args))
            w.jobs = args.warmup
            await async_closed(client, w, pool, Recorder(0))
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        if args.rate > 0:
            await async_open(client, args, pool, rec)
        else:
            await async_closed(client, args, pool, rec)
        return time.perf_counter() - t0, cpu_seconds() - cpu0


async def wait_workers_async(client, n):
    deadline = time.monotonic() + 60
    while True:
        try:
            if len((await client.stats())["workers"]) >= n:
                return
        except FerryError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("ferry.bench: fewer than %d workers after 60 s" % n)
        await asyncio.sleep(0.05)


# ---- sync (threads) -----------------------------------------------------------------------

def sync_closed(client, args, pool, rec):
    lock = threading.Lock()
    left = [args.jobs]
    timeout = args.timeout_ms / 1000.0

    def claim(n):
        with lock:
            n = min(n, left[0])
            left[0] -= n
            return n

    def runner(k):
        x = pool[(k * 7) % len(pool)]
        while claim(1):
            start, start_wall = time.perf_counter(), wall_us()
            try:
                rec.record(None, start, start_wall, client.run(args.model, x, timeout=timeout))
            except FerryError as e:
                rec.fail(e.id, e)

    def loader(t, k, batch):
        pending = collections.deque()
        more = True
        slots = [pool[(t * 7 + i) % len(pool)] for i in range(batch)]
        while True:
            free = k - len(pending)
            if more and (free >= batch or not pending):
                n = claim(min(free, batch))
                if n == 0:
                    more = False
                    continue
                start, start_wall = time.perf_counter(), wall_us()
                try:
                    ids = client.submit_many([{"model": args.model, "inputs": [slots[i]]}
                                              for i in range(n)])
                except FerryError as e:
                    ids = rec.rejected(e, n)
                pending.extend((i, start, start_wall) for i in ids)
                continue
            if not pending:
                break
            i, start, start_wall = pending.popleft()
            try:
                rec.record(i, start, start_wall, client.wait(i, timeout))
            except FerryError as e:
                rec.fail(i, e)

    threads = []
    if args.run:
        threads = [threading.Thread(target=runner, args=(k,)) for k in range(args.concurrency)]
    else:
        loaders = args.loaders or min(args.concurrency, 4)
        for t in range(loaders):
            k = args.concurrency // loaders + (1 if t < args.concurrency % loaders else 0)
            batch = max(1, min(k, args.submit_batch or k // 4))
            threads.append(threading.Thread(target=loader, args=(t, k, batch)))
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def sync_main(args, pool, rec):
    if args.rate > 0:
        raise SystemExit("ferry.bench: --rate needs --client async")
    with Client(args.frontend, args.redis, **client_options(args)) as client:
        if args.wait_workers:
            deadline = time.monotonic() + 60
            while len(client.stats()["workers"]) < args.wait_workers:
                if time.monotonic() > deadline:
                    raise SystemExit("ferry.bench: too few workers after 60 s")
                time.sleep(0.05)
        if args.warmup:
            w = argparse.Namespace(**vars(args))
            w.jobs = args.warmup
            sync_closed(client, w, pool, Recorder(0))
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        sync_closed(client, args, pool, rec)
        return time.perf_counter() - t0, cpu_seconds() - cpu0


# ---- report -------------------------------------------------------------------------------

def client_options(args):
    return {"push_results": not args.no_push, "consume_results": args.consume,
            "stored_input_bytes": args.stored_input_bytes,
            "attached_input_bytes": args.attached_input_bytes}


def summarize(label, rec, seconds, input_bytes, out):
    samples = rec.samples
    lat = sorted(s["latency_ms"] for s in samples)
    n = max(1, len(samples))
    jobs = len(samples)
    throughput = jobs / seconds if seconds > 0 else 0.0
    hist = collections.Counter(s["batch_size"] for s in samples)
    batch_mean = sum(s["batch_size"] for s in samples) / n
    out.update({
        "jobs": jobs, "failed": rec.failed, "seconds": seconds, "throughput": throughput,
        "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90),
        "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else 0.0, "mean_ms": sum(lat) / n,
        "batch_size_mean": batch_mean,
        "batch_sizes": {str(b): c for b, c in sorted(hist.items())},
    })
    print("%s: %d jobs, %d failed, %.2f s: %.0f jobs/s; latency ms p50 %.3f p90 %.3f p95 %.3f "
          "p99 %.3f max %.3f; mean batch %.1f" % (
              label, jobs, rec.failed, seconds, throughput, out["p50_ms"], out["p90_ms"],
              out["p95_ms"], out["p99_ms"], out["max_ms"], batch_mean))
    if input_bytes > 0:
        out_per_job = sum(s["output_bytes"] for s in samples) / n
        out.update({"input_bytes_per_job": input_bytes, "output_bytes_per_job": out_per_job,
                    "input_mbps": throughput * input_bytes / 1e6,
                    "output_mbps": throughput * out_per_job / 1e6})
        print("  bytes: %d in per job (%.1f MB/s), %.0f out per job (%.1f MB/s)" % (
            input_bytes, out["input_mbps"], out_per_job, out["output_mbps"]))
    staged = [s for s in samples if "compute" in s]
    total = max(1e-9, sum(lat) * 1000.0)
    sums = {k: sum(s.get(k, 0) for s in staged) for k in STAGES}
    out["share"] = {k: sums[k] / total for k in STAGES}
    out["stage_mean_us"] = {k: sums[k] / n for k in STAGES}
    print("  time share: " + " ".join("%s %.0f%% (%.0f us)" % (
        k, 100 * out["share"][k], out["stage_mean_us"][k]) for k in STAGES))
    med = {}
    for k in PARTS:
        med[k] = percentile(sorted(s[k] for s in staged if s.get("stages")), 50)
    out["stage_p50_us"] = med
    print("  stage p50 us: submit %.0f queue %.0f dispatch %.0f (transfer %.0f, worker %.0f) "
          "compute %.0f delivery %.0f" % tuple(med[k] for k in PARTS))


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m ferry.bench",
        description="Drives a Ferry fleet through the Python client (closed loop: "
                    "--concurrency; open loop: --rate) and measures throughput and latency.")
    a = ap.add_argument
    a("--frontend", default=None, help="broker frontend (default $FERRY_FRONTEND, then "
                                       "tcp://127.0.0.1:5555)")
    a("--redis", default=None, help="Redis URL (default $FERRY_REDIS, then "
                                    "redis://127.0.0.1:6379)")
    a("--model", default="tiny", help="model name")
    a("--shape", default="8", help="one job's input shape without the batch dim (3,224,224)")
    a("--dtype", default="float32", choices=sorted(DTYPES), help="input dtype")
    a("--jobs", type=int, default=1000, help="jobs to measure")
    a("--warmup", type=int, default=0, help="jobs run first and not measured")
    a("--concurrency", type=int, default=32, help="closed loop: jobs in flight")
    a("--rate", type=float, default=0.0, help="open loop: Poisson arrivals at this many jobs/s")
    a("--loaders", type=int, default=0,
      help="closed submit/wait loop: pipelines (coroutines or threads; 0: min(concurrency, 4))")
    a("--submit-batch", type=int, default=0,
      help="most jobs per submit_many (0: closed concurrency/loaders/4, open 64)")
    a("--timeout-ms", type=int, default=120000, help="wait timeout per job")
    a("--print-results", type=int, default=0, help="print the first N results")
    a("--seed", type=int, default=1, help="random seed of the inputs and arrivals")
    a("--no-push", action="store_true", help="broker notices only (push_results off)")
    a("--stored-input-bytes", type=int, default=64 * 1024,
      help="inputs of at least this size go to Redis, not through the broker (0: none)")
    a("--attached-input-bytes", type=int, default=16 * 1024,
      help="other inputs of at least this size go in data frames of their own (0: none)")
    a("--consume", action="store_true", help="consume_results: delete what wait/run return")
    a("--run", action="store_true", help="closed loop through run() (no ACCEPTED): "
                                         "--concurrency coroutines/threads, one job each")
    a("--client", choices=("async", "sync"), default="async",
      help="async: one AsyncClient, coroutines; sync: ferry.Client, threads")
    a("--wait-workers", type=int, default=0, help="first wait (up to 60 s) for N workers")
    a("--label", default="", help="name of this run in the output and JSON (default: model)")
    a("--json", default="", help="write the summary as one JSON object to this file")
    args = ap.parse_args(argv)
    try:
        args.shape = [int(d) for d in args.shape.split(",") if d != ""]
        if any(d < 0 for d in args.shape):
            raise ValueError
    except ValueError:
        ap.error("bad --shape")
    if args.jobs < 1 or args.concurrency < 1 or args.warmup < 0 or args.rate < 0:
        ap.error("--jobs and --concurrency must be >= 1")
    if args.run and args.rate > 0:
        ap.error("--run is a closed-loop mode (no --rate)")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cpu_start = cpu_seconds()
    pool = make_inputs(args)
    inputs_cpu = cpu_seconds() - cpu_start
    rec = Recorder(args.print_results)
    if args.client == "async":
        seconds, cpu = asyncio.run(async_main(args, pool, rec))
    else:
        seconds, cpu = sync_main(args, pool, rec)
    label = args.label or args.model
    out = {"command": " ".join(["python -m ferry.bench"] + argv), "client": args.client}
    if args.rate > 0:
        out.update({"mode": "open", "rate": args.rate})
    else:
        out.update({"mode": "closed-run" if args.run else "closed",
                    "concurrency": args.concurrency})
    out.update({"bench_cpu_s": cpu, "inputs_cpu_s": inputs_cpu, "model": args.model,
                "loaders": args.loaders, "submit_batch": args.submit_batch, "label": label,
                "shape": ",".join(map(str, args.shape)), "dtype": args.dtype})
    for r in rec.printed:
        first = r.outputs[0].reshape(-1)[:4] if r.outputs else []
        print("  %s  %s  worker=%s batch=%d  out[0][:4]=%s" % (
            r.id, r.status, r.worker, r.batch_size, ",".join("%.4f" % v for v in first)))
    input_bytes = int(np.prod(args.shape, dtype=np.int64)) * DTYPES[args.dtype].itemsize
    summarize(label, rec, seconds, input_bytes, out)
    out["process_cpu_s"] = cpu_seconds()
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out) + "\n")
    return 0 if rec.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
