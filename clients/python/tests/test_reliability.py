"""Backpressure, limits and failures, each on a fleet of its own: a broker killed and
restarted mid-run, Redis killed and restarted."""

import asyncio
import contextlib
import os
import re
import uuid

import numpy as np
import pytest

import ferry
from conftest import assert_tiny
from fleet import Fleet, wait_for


def test_queue_full_and_too_large(models_dir):
    # One worker holding at most 2 jobs (max batch 1 x (1 executor + 1)), 2 queued at most.
    f = Fleet(models_dir, models=("slow",), worker_args=["--max-batch", "1"],
              broker_args=["--max-queue", "2", "--max-job-bytes", "4096"])
    try:
        with ferry.Client(f.frontend, f.redis_url) as c:
            inline, stored, attached = (np.zeros(n, np.float32) for n in (2048, 50000, 6000))
            c.stats()  # answered after LIMITS: the client knows the broker's --max-job-bytes
            for x in (inline, stored, attached):  # refused here: nothing stored, nothing sent
                with pytest.raises(ferry.TooLarge) as e:
                    c.submit("slow", x)
                assert "(its --max-job-bytes): not sent" in e.value.message
                assert not e.value.retryable
            # As a client that has no answer to LIMITS yet: the broker refuses each (a stored
            # input from its shape, an attached one with its frame counted), and the client
            # deletes the stored inputs it wrote.
            c._aio._engine.broker_max_job_bytes = lambda: 0
            with pytest.raises(ferry.TooLarge) as e:
                c.submit("slow", inline)
            assert "the limit is 4096" in e.value.message and not e.value.retryable
            with pytest.raises(ferry.TooLarge) as e:
                c.run("slow", stored, timeout=30)
            assert "the limit is 4096" in e.value.message
            with pytest.raises(ferry.TooLarge) as e:
                c.submit("slow", attached)
            assert "the limit is 4096" in e.value.message
            wait_for(lambda: f.redis().keys("ferry:input:*") == [], 10, "inputs deleted")
            del c._aio._engine.broker_max_job_bytes
            accepted = []
            with pytest.raises(ferry.QueueFull) as e:
                for _ in range(20):
                    accepted.append(c.submit("slow", np.array([1500.0], np.float32)))
            assert e.value.retryable and e.value.id not in accepted
            assert 2 <= len(accepted) <= 4  # 2 on the worker (if it took them yet) + 2 queued
            with pytest.raises(ferry.QueueFull):
                c.run("slow", np.array([1.0], np.float32), timeout=30)
            report = c.cancel(*accepted)
            assert len(report.cancelled) + len(report.running) == len(accepted)
    finally:
        f.stop()


def test_a_job_over_the_brokers_message_limit_is_too_large_before_it_is_sent(models_dir):
    # A frame over --max-message-bytes makes the broker's libzmq drop the connection unanswered.
    # With the limit in max_message_bytes, run(timeout=None) raises TooLarge instead of
    # resubmitting for ever, and runs under it go in SUBMITs the broker takes.
    limit = 1 << 20
    f = Fleet(models_dir, models=("null",), broker_args=["--max-message-bytes", str(limit)])
    options = dict(stored_input_bytes=0, max_message_bytes=limit)

    async def main():
        async with ferry.AsyncClient(f.frontend, f.redis_url, **options) as c:
            with pytest.raises(ferry.TooLarge) as e:  # 2 MiB in one frame
                await asyncio.wait_for(c.run("null", np.ones(limit // 2, np.float32)), 60)
            assert "max_message_bytes" in str(e.value) and not e.value.retryable
        # Inside the body: with a 128-character id, 16 dimensions and every option the job
        # alone packs to ~60 bytes under the limit, and the SUBMIT's header may not fit beside
        # it: the client keeps 1 KiB of the limit for the header, and refuses it.
        async with ferry.AsyncClient(f.frontend, f.redis_url, attached_input_bytes=0,
                                     **options) as c:
            x = np.ones((1,) * 15 + ((limit - 320) // 4,), np.float32)
            with pytest.raises(ferry.TooLarge) as e:
                await asyncio.wait_for(c.run("null", x, id="a" * 128, priority=2**63 - 1,
                                             timeout_ms=3600000, result_ttl_s=86400), 60)
            assert e.value.id == "a" * 128
        async with ferry.AsyncClient(f.frontend, f.redis_url, **options) as c:
            # Eight runs of 320 KB in one turn: one SUBMIT would be 2.5 MiB, refused whole.
            xs = [np.full(80000, i, np.float32) for i in range(8)]
            rs = await asyncio.wait_for(
                asyncio.gather(*(c.run("null", x, timeout=60) for x in xs)), 90)
            for x, r in zip(xs, rs):
                np.testing.assert_array_equal(r.outputs[0], x)

    try:
        f.wait_workers(1)
        asyncio.run(main())
        with pytest.raises(ferry.InvalidArgument):
            ferry.Client(f.frontend, f.redis_url, max_message_bytes=1000)
    finally:
        f.stop()


def test_the_client_learns_the_brokers_message_limit_on_each_connection(models_dir):
    # max_message_bytes left at its default (65 MiB) over a broker that takes 1 MiB a message:
    # the client asks the broker (LIMITS) first on each connection, so a job over the broker's
    # limit is TooLarge, naming it, instead of a frame that makes the broker drop the
    # connection unanswered (run(timeout=None) resubmitted it for ever), and runs under it are
    # split into SUBMITs the broker takes. A broker restarted with a lower limit is asked again.
    limit, lower = 1 << 20, 1 << 18
    f = Fleet(models_dir, models=("null",), broker_args=["--max-message-bytes", str(limit)])
    big = np.ones(limit // 2, np.float32)  # 2 MiB in one frame
    xs = [np.full(80000, i, np.float32) for i in range(8)]  # 320 KB each

    async def main():
        loop = asyncio.get_running_loop()
        async with ferry.AsyncClient(f.frontend, f.redis_url, stored_input_bytes=0) as c:
            with pytest.raises(ferry.TooLarge) as e:
                await asyncio.wait_for(c.run("null", big, timeout=None), 60)
            assert "limit of %d bytes" % limit in e.value.message and not e.value.retryable
            with pytest.raises(ferry.TooLarge) as e:  # not Unavailable (the connection dropped)
                await asyncio.wait_for(c.submit("null", big), 60)
            assert "limit of %d bytes" % limit in e.value.message
            # Eight runs of 320 KB in one turn: one SUBMIT would be 2.5 MiB.
            rs = await asyncio.wait_for(
                asyncio.gather(*(c.run("null", x, timeout=60) for x in xs)), 90)
            for x, r in zip(xs, rs):
                np.testing.assert_array_equal(r.outputs[0], x)

            f.broker_args = ["--max-message-bytes", str(lower)]
            await loop.run_in_executor(None, f.restart_broker)
            await loop.run_in_executor(None, f.wait_workers, 1)
            with pytest.raises(ferry.TooLarge) as e:  # the first broker took it
                await asyncio.wait_for(c.run("null", xs[0], timeout=None), 60)
            assert "limit of %d bytes" % lower in e.value.message
            small = np.arange(8, dtype=np.float32)
            r = await asyncio.wait_for(c.run("null", small, timeout=60), 90)
            np.testing.assert_array_equal(r.outputs[0], small)
        # A job refused whole before it was sent: its stored inputs are nobody's, deleted --
        # under ids the client made. A caller's id may be a pending job's (a retry), whose
        # inputs those keys are: they stay (and expire).
        async with ferry.AsyncClient(f.frontend, f.redis_url, stored_input_bytes=1 << 20) as c:
            stored, attached = np.ones(1 << 19, np.float32), np.ones(1 << 17, np.float32)
            with pytest.raises(ferry.TooLarge):
                await asyncio.wait_for(c.run("null", stored, attached, timeout=None), 60)
            with pytest.raises(ferry.TooLarge):
                await asyncio.wait_for(c.submit("null", stored, attached), 60)
            await loop.run_in_executor(None, lambda: wait_for(
                lambda: f.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted"))
            with pytest.raises(ferry.TooLarge):
                await asyncio.wait_for(c.submit("null", stored, attached, id="a-retry"), 60)
            with pytest.raises(ferry.TooLarge):
                await asyncio.wait_for(
                    c.run("null", stored, attached, id="a-run-retry", timeout=None), 60)
            with pytest.raises(ferry.TooLarge):  # its DEL goes after any of theirs
                await asyncio.wait_for(c.submit("null", stored, attached), 60)
            kept = [b"ferry:input:a-retry:0", b"ferry:input:a-run-retry:0"]
            await loop.run_in_executor(None, lambda: wait_for(
                lambda: sorted(f.redis().keys("ferry:input:*")) == kept, 10,
                "only the inputs of the client's own ids deleted"))

    try:
        f.wait_workers(1)
        asyncio.run(main())
    finally:
        f.stop()


def test_a_job_over_the_brokers_job_limit_is_refused_before_its_inputs_are_stored(models_dir):
    # The broker's --max-job-bytes comes with LIMITS too: a job with more input bytes is
    # TooLarge at once, its stored input never written to Redis (the broker would refuse it
    # only after the write: "the limit is ...").
    f = Fleet(models_dir, models=("null",), broker_args=["--max-job-bytes", "4000000"])
    x = np.ones(1200000, np.float32)  # 4.8 MB, stored

    async def main():
        async with ferry.AsyncClient(f.frontend, f.redis_url, stored_input_bytes=1 << 16) as c:
            await c.stats()  # answered after LIMITS: the limits are known
            before = f.redis().info("stats")["total_net_input_bytes"]
            with pytest.raises(ferry.TooLarge) as e:
                await c.submit("null", x)
            assert "at most 4000000 a job (its --max-job-bytes): not sent" in e.value.message
            with pytest.raises(ferry.TooLarge):
                await asyncio.wait_for(c.run("null", x, timeout=None), 60)
            assert f.redis().info("stats")["total_net_input_bytes"] - before < 1 << 20
            small = np.arange(8, dtype=np.float32)
            r = await asyncio.wait_for(c.run("null", small, timeout=60), 90)
            np.testing.assert_array_equal(r.outputs[0], small)
    try:
        f.wait_workers(1)
        asyncio.run(main())
    finally:
        f.stop()


def test_a_client_is_still_answered_after_many_broker_kills(models_dir):
    """LIMITS on every new connection, through 60 broker kills while another task keeps
    requests in flight: one LIMITS sent as the connection dropped is lost (libzmq takes it into
    the dead connection's pipe), and without a resend every request behind it waited for ever."""
    f = Fleet(models_dir, workers=0)

    async def main():
        loop = asyncio.get_running_loop()
        async with ferry.AsyncClient(f.frontend, f.redis_url, push_results=False,
                                     request_timeout_ms=1000) as c:
            busy = True

            async def other():
                while busy:
                    try:
                        await c.stats()
                    except ferry.Unavailable:
                        pass
            background = asyncio.ensure_future(other())
            try:
                for kill in range(1, 61):
                    await loop.run_in_executor(None, f.restart_broker)
                    for _ in range(30):
                        try:
                            await c.stats()
                            break
                        except ferry.Unavailable:
                            pass
                    else:
                        raise AssertionError("no answer for 30 s after broker kill %d" % kill)
            finally:
                busy = False
                await background
    try:
        asyncio.run(main())
    finally:
        f.stop()


def test_broker_killed_and_restarted_mid_run(models_dir):
    f = Fleet(models_dir, models=("slow",), worker_args=["--max-batch", "8"])
    total_runs, total_waits = 240, 40
    try:
        async def main():
            loop = asyncio.get_running_loop()
            done = []
            # request_timeout_ms: a run with no result after 1 s GETs its result and, if there
            # is none, resubmits the same id (covers a SUBMIT lost with the broker).
            async with ferry.AsyncClient(f.frontend, f.redis_url, request_timeout_ms=1000) as c:
                x = np.array([15.0], np.float32)  # ~15 ms a batch
                ids = await c.submit_many([ferry.Job("slow", x) for _ in range(total_waits)])

                async def one_run():
                    r = await c.run("slow", x, timeout=90)
                    done.append(r)
                    return r

                async def one_wait(i):
                    r = await c.wait(i, timeout=90)
                    done.append(r)
                    return r

                runs = [asyncio.ensure_future(one_run()) for _ in range(total_runs)]
                waits = [asyncio.ensure_future(one_wait(i)) for i in ids]
                await loop.run_in_executor(
                    None, lambda: wait_for(lambda: len(done) >= 20, 60, "20 results"))
                killed_at = len(done)
                await loop.run_in_executor(None, f.restart_broker)  # SIGKILL, start again
                results = await asyncio.gather(*runs, *waits)
                return killed_at, results, ids

        killed_at, results, ids = asyncio.run(main())
        print("killed at", killed_at, "attempts", sorted(set(r.attempt for r in results)),
              f.stats()["counters"])
        assert killed_at < (total_runs + total_waits) // 2  # the kill did land mid-run
        assert len(results) == total_runs + total_waits
        assert len({r.id for r in results}) == len(results)
        assert [r.id for r in results[total_runs:]] == ids
        for r in results:
            assert r.status == "done", r
            assert r.outputs[0].tolist() == [15.0]
    finally:
        f.stop()


def test_redis_killed_and_restarted(models_dir):
    f = Fleet(models_dir, models=("tiny",))
    x = np.linspace(-1, 1, 8).astype(np.float32)
    try:
        async def main():
            loop = asyncio.get_running_loop()
            async with ferry.AsyncClient(f.frontend, f.redis_url) as c:
                assert_tiny(await c.run("tiny", x, timeout=30), x)  # subscribed, warm
                await loop.run_in_executor(None, f.kill, f.redis_proc)
                with pytest.raises(ferry.Unavailable) as e:
                    await c.submit("tiny", x)  # the broker cannot journal it
                assert e.value.retryable
                with pytest.raises(ferry.Unavailable):
                    await c.poll("py-some-id")
                # Runs made while Redis is down: rejected `unavailable`, resubmitted with the
                # same id after a back-off until Redis is back.
                runs = [asyncio.ensure_future(c.run("tiny", x * k, timeout=90))
                        for k in range(20)]
                rejected = f.stats()["counters"]["rejected"]
                await loop.run_in_executor(None, lambda: wait_for(
                    lambda: f.stats()["counters"]["rejected"] >= rejected + 20, 30,
                    "the 20 runs rejected (unavailable) by the broker"))
                assert not any(r.done() for r in runs)
                await loop.run_in_executor(None, f.start_redis)
                results = await asyncio.gather(*runs)
                for k, r in enumerate(results):
                    assert_tiny(r, x * k)
                assert_tiny(await c.run("tiny", x, timeout=30), x)
        asyncio.run(main())
    finally:
        f.stop()


def _metric(metrics_port, series):
    """The value of `series` (a name and its labels, as Prometheus writes them) at the
    broker's /metrics; 0 when absent."""
    import urllib.request
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
    return float(m.group(1)) if m else 0.0


def _finished(metrics_port, model, status):
    """The broker's ferry_jobs_finished_total{model, status}."""
    return _metric(metrics_port,
                   'ferry_jobs_finished_total{model="%s",status="%s"}' % (model, status))


# The error reply Redis gives while it loads its data: one that says to wait (retried).
_LOADING = "LOADING Redis is loading the dataset in memory"


def _result_write_key(argv):
    """The key of a result write as the worker sends it (SET, or the notice script's EVAL);
    None for any other command."""
    name = argv[0].upper()
    return argv[1] if name == b"SET" else argv[3] if name == b"EVAL" else None


@contextlib.contextmanager
def _proxied_fleet(models_dir, models, refuse, cut=None):
    """A Fleet serving `models`, its broker's /metrics on a free port, and one worker that
    reaches the fleet's Redis through a RedisProxy with `refuse` (and `cut`), at the broker:
    yields (fleet, metrics port, proxy), and stops them after. `refuse` and `cut` see the
    worker's first commands (its PING) before the yield: the names they use that the test binds
    in the `with` (the proxy, a Redis connection) are for result writes, which come later."""
    from fleet import free_port
    from redis_proxy import RedisProxy
    metrics = free_port()
    f = Fleet(models_dir, models=models, workers=0, broker_args=["--metrics-port", str(metrics)])
    proxy = None
    try:
        proxy = RedisProxy(f.redis_port, refuse, cut)
        f.start_worker(redis_url="redis://127.0.0.1:%d" % proxy.port)
        f.wait_workers(1)
        yield f, metrics, proxy
    finally:
        f.stop()
        if proxy is not None:
            proxy.close()


def test_a_result_redis_refuses_for_good_becomes_a_failure_that_keeps_the_jobs_ttl(models_dir):
    # The worker reaches Redis through a proxy that refuses the first write of two jobs'
    # results with an error reply that no retry cures (as a managed Redis or a proxy may for a
    # value it will not take): a small record (the notice script) and one too big to go inline
    # (SET, then PUBLISH). The worker stores a `failed` record (code internal, saying why) in
    # its place, plainly and with the job's own expiry (not the default); the producer waiting
    # for it is told, the broker counts the job failed, and the worker goes on serving.
    small, big = ("py-refused-%s-%s" % (kind, uuid.uuid4().hex[:8]) for kind in ("small", "big"))
    keys = {("ferry:result:" + job).encode(): job for job in (small, big)}
    refused_keys = []

    def refuse(argv):
        key = _result_write_key(argv)
        if key in keys and key not in refused_keys:
            refused_keys.append(key)
            return "ERR the value is refused by the test proxy"
        return None
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny", "null"), refuse) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            assert_tiny(c.run("tiny", x, timeout=30), x)  # through the proxy, untouched
            c.submit("tiny", x, id=small, result_ttl_s=7777)
            c.submit("null", np.ones(100000, np.float32), id=big, result_ttl_s=7777)
            for job in (small, big):
                r = c.wait(job, timeout=60)
                assert r.status == "failed" and r.error[0] == "internal", (job, r)
                assert r.error[1] == ("Redis refused this job's result: ERR the value is "
                                      "refused by the test proxy"), r
                ttl = f.redis().ttl("ferry:result:" + job)
                assert 7000 < ttl <= 7777, ttl  # the job's, not the worker's --result-ttl-s
            assert sorted(argv[0].upper() for argv in proxy.refused) == [b"EVAL", b"SET"]
            assert "Redis refused its result for good" in f.log_tail("worker0")
            # The DONE may reach the broker after the producer read the record.
            for model in ("tiny", "null"):
                wait_for(lambda: _finished(metrics, model, "failed") == 1, 10,
                         "the broker's count of %s jobs failed" % model)
            assert_tiny(c.run("tiny", x, timeout=30), x)  # still serving


def test_a_refused_write_that_got_through_leaves_the_job_done(models_dir):
    # The proxy runs the write on Redis and then answers it with a final error anyway (a write
    # whose reply was lost in an outage and replaced by another, say). The worker's failure
    # record then finds the job's own result there (SET NX: nil): the job stays `done`, in Redis
    # and in the broker's count.
    job = "py-got-through-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()

    def refuse(argv):
        if _result_write_key(argv) != key or proxy.refused:
            return None
        store.execute_command(*argv)  # it got through
        return "ERR the reply is refused by the test proxy"
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), refuse) as (f, metrics, proxy):
        store = f.redis()
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit("tiny", x, id=job)
            assert_tiny(c.wait(job, timeout=60), x)
            # The record got through before the proxy noted its refusal: the wait may be first.
            wait_for(lambda: len(proxy.refused) == 1, 10, "the proxy's refusal")
            wait_for(lambda: "Redis refused its result for good" in f.log_tail("worker0"), 10,
                     "the worker's log of the refusal")
            wait_for(lambda: _finished(metrics, "tiny", "done") == 1, 10,
                     "the broker's count of jobs done")
            assert _finished(metrics, "tiny", "failed") == 0
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0


def test_a_round_retried_for_one_result_keeps_the_others_answers(models_dir):
    # Three jobs' results in one write round: job a's write gets an error reply that says to
    # wait (LOADING, once); job b's finds a record there (b ran before under the same id: SET NX
    # answers nil, a duplicate); job c's is stored. The worker writes the round again, sending
    # only a's write: b counts as one duplicate (before, a retried round counted none, its nil
    # being its own answer again), c's record and notice are not sent twice, b's first result
    # stands.
    a, b, c_ = ("py-retried-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "abc")
    key = {job: ("ferry:result:" + job).encode() for job in (a, b, c_)}
    writes = []  # the result keys the worker wrote, in order, once the round is under way

    def refuse(argv):
        k = _result_write_key(argv)
        if k is None or not armed:
            return None
        writes.append(k)
        return _LOADING if writes == [key[a]] else None
    armed = []
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), refuse) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            assert_tiny(c.run("tiny", x, id=b, timeout=30), x)
            armed.append(True)
            c.submit_many([{"model": "tiny", "inputs": [x * (k + 2)], "id": job}
                           for k, job in enumerate((a, b, c_))])
            assert_tiny(c.wait(a, timeout=30), x * 2)
            assert_tiny(c.wait(c_, timeout=30), x * 4)
            # One SUBMIT, one CHUNK, one batch: one round of three writes, then a's again.
            wait_for(lambda: "3 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            wait_for(lambda: _metric(metrics, "ferry_duplicates_suppressed_total") == 1, 10,
                     "the broker's count of duplicates")
            assert writes == [key[a], key[b], key[c_], key[a]], writes
            assert_tiny(c.wait(b, timeout=30), x)  # the first result of b stands
            assert _finished(metrics, "tiny", "failed") == 0


def test_a_round_cut_off_partway_keeps_the_answers_it_read(models_dir):
    # Two jobs' results in one write round: a's write is answered OK; the connection breaks in
    # the middle of b's reply (the proxy sends half of it and closes). The worker writes the
    # round again on a new connection, sending only b's write, which finds b's record there
    # (it got through): no duplicate, since its answer was lost, not refused. Before, a broken
    # connection threw away the answers read before it, and the retry wrote a again too.
    a, b = ("py-cut-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "ab")
    key = {job: ("ferry:result:" + job).encode() for job in (a, b)}
    writes = []  # the result keys the worker wrote, in order

    def seen(argv):
        k = _result_write_key(argv)
        if k is not None:
            writes.append(k)
        return None

    def cut(argv):
        return _result_write_key(argv) == key[b] and writes.count(key[b]) == 1
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), seen, cut) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit_many([{"model": "tiny", "inputs": [x * (k + 2)], "id": job}
                           for k, job in enumerate((a, b))])
            assert_tiny(c.wait(a, timeout=30), x * 2)
            assert_tiny(c.wait(b, timeout=30), x * 3)
            # One SUBMIT, one CHUNK, one batch: one round of two writes, then b's again.
            wait_for(lambda: "2 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            assert len(proxy.cut_off) == 1
            wait_for(lambda: _finished(metrics, "tiny", "done") == 2, 10,
                     "the broker's count of jobs done")
            assert writes == [key[a], key[b], key[b]], writes
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0


def test_a_write_refused_after_it_got_through_is_no_duplicate_when_its_round_is_retried(
        models_dir):
    # Two big results (plain SET, then PUBLISH) in one round: a's write gets LOADING (once), d's
    # is run on Redis and then answered with an error no retry cures (its reply lost and
    # replaced, say). The round is retried for a's sake, and d's write with it: its SET NX finds
    # d's own record (nil). That is no duplicate and no refusal: both jobs are done.
    a, d = ("py-got-through-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "ad")
    key_a, key_d = (("ferry:result:" + job).encode() for job in (a, d))
    answered = set()

    def refuse(argv):
        k = _result_write_key(argv)
        if k not in (key_a, key_d) or k in answered:
            return None
        answered.add(k)
        if k == key_a:
            return _LOADING
        store.execute_command(*argv)  # it got through
        return "ERR the reply is refused by the test proxy"
    xs = {a: np.full(100000, 2, np.float32), d: np.full(100000, 3, np.float32)}
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy):
        store = f.redis()
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit_many([{"model": "null", "inputs": [xs[job]], "id": job} for job in (a, d)])
            for job in (a, d):
                r = c.wait(job, timeout=30)
                assert r.status == "done", (job, r)
                np.testing.assert_array_equal(r.outputs[0], xs[job])
            wait_for(lambda: "2 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            wait_for(lambda: _finished(metrics, "null", "done") == 2, 10,
                     "the broker's count of jobs done")
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0
            assert "refused its result" not in f.log_tail("worker0")


@contextlib.contextmanager
def _notice_counter(f):
    """A pattern subscription to every client's notice channel in f's Redis, for as long as the
    `with` lasts. Yields a function that counts the notices naming a job that came since its
    last call (each waits 1 s for more)."""
    notices = f.redis().pubsub()
    notices.psubscribe("ferry:notify:*")

    def notices_of(job_id):
        n = 0
        while True:
            m = notices.get_message(timeout=1)
            if m is None:
                return n
            if m["type"] == "pmessage" and job_id.encode() in m["data"]:
                n += 1
    try:
        yield notices_of
    finally:
        notices.close()


def _until_subscribed(c, notices_of):
    """Runs warm-up jobs on `c` until one's notice comes on its channel (a client subscribes to
    its channel on its first job). Returns how many it ran."""
    warm_ups = []

    def subscribed():
        warm_up = "py-warm-up-" + uuid.uuid4().hex[:8]
        warm_ups.append(warm_up)
        assert c.run("null", np.ones(4, np.float32), id=warm_up, timeout=30).ok
        return notices_of(warm_up) == 1
    wait_for(subscribed, 20, "a notice of a warm-up job")
    return len(warm_ups)


def test_a_big_results_notice_goes_once_however_often_its_write_is_retried(models_dir):
    # A record too big for the notice script goes as SET NX, then PUBLISH of a notice naming
    # the job, in one pipeline. Redis answers the SET three times with LOADING (it still runs
    # the PUBLISH): the notice went out with the first try, and the retries, which store the
    # record at the fourth, do not send it again. The producer gets its result all the same.
    job = "py-notice-once-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()
    loading = []

    def refuse(argv):
        if _result_write_key(argv) != key or len(loading) == 3:
            return None
        loading.append(argv)
        return _LOADING
    x = np.full(100000, 5, np.float32)
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy), \
            _notice_counter(f) as notices_of, ferry.Client(f.frontend, f.redis_url) as c:
        warm_ups = _until_subscribed(c, notices_of)
        r = c.run("null", x, id=job, timeout=30)
        assert r.status == "done", r
        np.testing.assert_array_equal(r.outputs[0], x)
        assert [argv[0].upper() for argv in loading] == [b"SET"] * 3  # not the script
        # DONE follows the last round: every notice there will be has been published.
        wait_for(lambda: _finished(metrics, "null", "done") == warm_ups + 1, 10,
                 "the broker's count of jobs done")
        assert notices_of(job) == 1


def test_a_result_read_before_its_early_notice_came_true_is_read_again_on_finished(
        models_dir, monkeypatch):
    # The notice of a big record goes with the first try of its write: when Redis refuses that
    # SET (LOADING), the producer hears of a record that is not there yet and reads nothing.
    # The worker's next try stores it -- held back here until the test has seen, through
    # MONITOR, the producer's GET that found nothing -- and the broker's FINISHED (the job is
    # not in DONE's `notified`) must make the producer read again. Its own re-checks are set to
    # ten minutes, so without that the run times out.
    import threading
    from ferry import _results
    monkeypatch.setattr(_results, "FIRST_RECHECK", 600.0)
    monkeypatch.setattr(_results, "MAX_RECHECK", 600.0)
    job = "py-read-again-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()
    read_nothing = threading.Event()
    loading = []

    def refuse(argv):
        if _result_write_key(argv) != key:
            return None
        if not loading:
            loading.append(argv)
            return _LOADING
        assert read_nothing.wait(30), "the producer never read the result early"
        return None

    def watch(monitor):
        for command in monitor.listen():
            if command["command"] == "GET " + key.decode():
                read_nothing.set()
                return
    x = np.full(100000, 7, np.float32)
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy), \
            _notice_counter(f) as notices_of, f.redis().monitor() as monitor, \
            ferry.Client(f.frontend, f.redis_url) as c:
        warm_ups = _until_subscribed(c, notices_of)
        threading.Thread(target=watch, args=(monitor,), daemon=True).start()
        r = c.run("null", x, id=job, timeout=20)
        assert r.status == "done", r
        np.testing.assert_array_equal(r.outputs[0], x)
        assert read_nothing.is_set()
        assert [argv[0].upper() for argv in loading] == [b"SET"]
        assert notices_of(job) == 1  # the early one, and no other
        assert _finished(metrics, "null", "done") == warm_ups + 1


def test_an_acl_without_publish_makes_the_worker_write_results_without_notices(models_dir):
    # The worker's ACL user may run the notice script and PUBLISH, but on no channel (the
    # `&ferry:notify:*` of deploy/redis/users.acl forgotten): inside the script Redis 7.0 says
    # "The user executing the script can't publish to the channel ...", without NOPERM, after
    # the script's SET stored the record. The worker takes it for what it is: it writes results
    # without notices from then on (the broker's FINISHED tells the producer), and no job is
    # failed or logged as refused. Flat rules, no selectors: Redis 6.2 takes them too.
    f = Fleet(models_dir, models=("tiny",), workers=0)
    xs = [np.linspace(-1, 1, 8).astype(np.float32) * k for k in range(1, 6)]
    try:
        pw = uuid.uuid4().hex
        f.redis().execute_command(
            "ACL", "SETUSER", "py-no-publish", "on", ">" + pw, "resetchannels", "-@all",
            "+ping", "+set", "+eval", "+publish", "+get", "+del", "~ferry:result:*",
            "~ferry:input:*")
        pw_file = os.path.join(f.dir, "no-publish.pw")
        with open(pw_file, "w") as out:
            out.write(pw + "\n")
        f.start_worker(redis_url="redis://py-no-publish@127.0.0.1:%d" % f.redis_port,
                       extra=["--redis-password-file", pw_file])
        f.wait_workers(1)
        with ferry.Client(f.frontend, f.redis_url) as c:
            for x in xs:
                assert_tiny(c.run("tiny", x, timeout=60), x)
        log = f.log_tail("worker0", 200)
        assert "writing results without notices from now on" in log, log
        assert "refused its result" not in log, log
    finally:
        f.stop()
