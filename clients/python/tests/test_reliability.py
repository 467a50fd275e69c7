"""Backpressure, limits and failures, each on a fleet of its own: a broker killed and
restarted mid-run, Redis killed and restarted. Result writes Redis refuses or cuts off:
test_result_writes.py."""

import asyncio

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
