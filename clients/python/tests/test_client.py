"""The clients against a real fleet (redis-server, ferry-broker, ferry-worker): the API
itself. Big inputs are in test_client_big_inputs.py, misbehaving peers in
test_client_faults.py."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq.auth

import ferry
from conftest import assert_tiny, spy_submits, uid
from fleet import wait_for


def test_run_and_submit_wait_give_the_reference_outputs(client):
    rng = np.random.default_rng(1)
    xs = rng.uniform(-1, 1, (40, 8)).astype(np.float32)
    for x in xs[:5]:
        r = client.run("tiny", x, timeout=30)
        assert_tiny(r, x)
        assert r.model == "tiny" and r.worker == "py-worker-0" and r.attempt == 1
        assert r.batch_size >= 1
        assert {"submitted", "dispatched", "received", "compute_start", "compute_end",
                "finished"} <= set(r.timing)
    ids = client.submit_many([ferry.Job("tiny", x) for x in xs[5:20]]
                             + [{"model": "tiny", "inputs": [x]} for x in xs[20:]])
    assert len(set(ids)) == 35
    for i, x in zip(ids, xs[5:]):
        r = client.wait(i, timeout=30)
        assert r.id == i
        assert_tiny(r, x)
    one = client.submit("tiny", xs[0].tolist() and xs[0], id=uid("given"), priority=3)
    assert one.startswith("py-given-")
    assert_tiny(client.wait(one, timeout=30), xs[0])


def test_several_outputs_and_every_dtype_through_a_worker(client):
    a = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    b = np.array([3, -10, 2 ** 40], np.int64)
    r = client.run("multi", a, b, timeout=30)
    assert r.status == "done" and len(r.outputs) == 2
    np.testing.assert_array_equal(r.outputs[0], 2 * a + 1)
    assert r.outputs[1].dtype == np.int64 and r.outputs[1].shape == ()
    assert int(r.outputs[1]) == b.sum()
    assert r.output_dtypes == ["float32", "int64"]
    # null.pt returns its input: every protocol dtype there and back through libtorch.
    rng = np.random.default_rng(2)
    for name, dt in sorted(ferry.DTYPES.items()):
        if name == "bfloat16":
            x = ferry.bfloat16(np.array([1.5, -3.0, 0.0078125], np.float32))
            want = np.array([1.5, -3.0, 0.0078125], np.float32)
        elif name == "bool":
            x = want = np.array([True, False, True])
        elif dt.kind == "f":
            x = want = rng.standard_normal((2, 3)).astype(dt)
        else:
            x = want = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, (3, 2)).astype(dt)
        r = client.run("null", x, timeout=30)
        assert r.status == "done", (name, r)
        assert r.output_dtypes == [name]
        assert r.outputs[0].dtype == want.dtype and r.outputs[0].shape == want.shape, name
        np.testing.assert_array_equal(r.outputs[0], want)


def test_a_model_error_is_a_failed_result(client):
    r = client.run("tiny", np.zeros(5, np.float32), timeout=30)  # tiny takes [8]
    assert r.status == "failed" and r.error[0] == "model_error" and not r.ok
    with pytest.raises(ferry.FerryError) as e:
        r.raise_for_status()
    assert e.value.code == "model_error"


def test_poll_wait_timeout_and_consume(fleet, client):
    x = np.ones(8, np.float32)
    assert client.poll(uid("never")) is None
    with pytest.raises(ferry.Timeout) as e:
        client.wait(uid("never"), timeout=0.2)
    assert isinstance(e.value, TimeoutError)
    i = client.submit("tiny", x)
    assert_tiny(client.wait(i, timeout=30), x)
    assert_tiny(client.poll(i), x)  # poll reads Redis; the result stays
    # consume_results: what wait reads from Redis is deleted (DEL) before wait returns. An id
    # submitted by another client gets no notice here, so this wait reads Redis.
    with ferry.Client(fleet.frontend, fleet.redis_url, consume_results=True) as consumer:
        assert_tiny(consumer.wait(i, timeout=30), x)
        assert consumer.poll(i) is None
    assert fleet.redis().exists("ferry:result:" + i) == 0
    # Results that come inline (notices, FINISHED) are deleted too, in the background.
    with ferry.Client(fleet.frontend, fleet.redis_url, consume_results=True) as consumer:
        ids = [consumer.run("tiny", x, timeout=30).id for _ in range(20)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                fleet.redis().exists("ferry:result:" + j) for j in ids):
            time.sleep(0.05)
        assert [j for j in ids if fleet.redis().exists("ferry:result:" + j)] == []
    with ferry.Client(fleet.frontend, fleet.redis_url) as keeper:
        kept = keeper.run("tiny", x, timeout=30).id
    assert fleet.redis().exists("ferry:result:" + kept) == 1


def test_stats(client):
    st = client.stats()
    assert "rid" not in st
    assert [w["id"] for w in st["workers"]] == ["py-worker-0"]
    assert {"tiny", "multi", "null", "slow"} <= set(st["workers"][0]["models"])
    assert st["counters"]["accepted"] >= 0 and isinstance(st["queues"], dict)


def test_rejections_from_the_broker(client):
    x = np.ones(8, np.float32)
    with pytest.raises(ferry.UnknownModel) as e:
        client.submit("no-such-model", x, id="py-unknown-1")
    assert e.value.code == "unknown_model" and e.value.id == "py-unknown-1"
    assert not e.value.retryable
    with pytest.raises(ferry.UnknownModel):
        client.run("no-such-model", x, timeout=30)
    bad = ferry.Tensor(x, "float32")
    bad.data = bad.data[:30]  # 30 bytes for a [8] float32: the broker's check, not ours
    with pytest.raises(ferry.InvalidArgument):
        client.submit("tiny", bad)
    with pytest.raises(ferry.InvalidArgument):  # ours: a bad id never leaves
        client.submit("tiny", x, id="not valid")
    # duplicate: an id still pending. submit says so; run waits for that job instead.
    slow_id = uid("dup")
    client.submit("slow", np.array([300.0], np.float32), id=slow_id)
    with pytest.raises(ferry.Duplicate):
        client.submit("slow", np.array([1.0], np.float32), id=slow_id)
    r = client.run("slow", np.array([1.0], np.float32), id=slow_id, timeout=60)
    assert r.status == "done" and float(r.outputs[0][0]) == 300.0  # the pending job's result
    # submit_many: the accepted ones are accepted; the error lists them and the rejected.
    good = uid("good")
    with pytest.raises(ferry.UnknownModel) as e:
        client.submit_many([ferry.Job("tiny", x, id=good), ferry.Job("nope", x)])
    assert e.value.accepted == [good] and len(e.value.ids) == 2
    assert set(e.value.errors) == {e.value.ids[1]}
    assert_tiny(client.wait(good, timeout=30), x)


def test_submit_many_sends_the_jobs_the_clients_checks_pass(fleet, client):
    """A job that fails the client's own checks is not sent; the others are, and the error
    tells each job's fate (as the C++ SDK's outcomes do)."""
    x = np.arange(8, dtype=np.float32)
    a, b, bad, nope = uid("many-a"), uid("many-b"), uid("many-bad"), uid("many-nope")
    jobs = [ferry.Job("tiny", x, id=a),
            ferry.Job("tiny", np.ones(8, np.complex64), id=bad),  # no protocol dtype: ours
            ferry.Job("nope", x, id=nope),  # the broker's: unknown model
            ferry.Job("tiny", x + 1, id=b)]
    with pytest.raises(ferry.InvalidArgument) as e:
        client.submit_many(jobs)
    assert e.value.id == bad  # the first job, in order, that was not accepted
    assert e.value.ids == [a, bad, nope, b]
    assert e.value.accepted == [a, b]
    assert set(e.value.errors) == {bad, nope}
    assert isinstance(e.value.errors[nope], ferry.UnknownModel)
    assert_tiny(client.wait(a, timeout=30), x)
    assert_tiny(client.wait(b, timeout=30), x + 1)
    assert client.poll(bad) is None  # never sent: no result will come
    # Nothing to send: the first local failure, and no SUBMIT.
    with ferry.Client(fleet.frontend, fleet.redis_url, stored_input_bytes=0,
                      max_message_bytes=1 << 20) as small:
        with pytest.raises(ferry.TooLarge) as e:
            small.submit_many([ferry.Job("tiny", np.ones(1 << 19, np.float32), id=bad),
                               ferry.Job("tiny", np.ones(8, np.complex64))])
    assert e.value.id == bad and e.value.accepted == [] and len(e.value.errors) == 2
    # A call with a job that cannot be named, or an id given twice, sends nothing.
    never, twice = uid("never"), uid("twice")
    for named in ([ferry.Job("tiny", x, id=never), ferry.Job("tiny", x, id="a b")],
                  [ferry.Job("tiny", x, id=never), ferry.Job("tiny", x, id=twice),
                   ferry.Job("tiny", x, id=twice)]):
        with pytest.raises(ferry.InvalidArgument) as e:
            client.submit_many(named)
        assert e.value.ids == [] and e.value.accepted == [] and e.value.errors == {}
    assert client.submit_many([]) == []
    x2 = client.submit_many([ferry.Job("tiny", x)])  # a SUBMIT after them, on the same socket
    assert_tiny(client.wait(x2[0], timeout=30), x)
    assert client.poll(never) is None and client.poll(twice) is None


def test_a_notify_channel_only_while_at_most_64_jobs_are_tracked(fleet):
    """protocol.md, SUBMIT: a SUBMIT names the client's notify channel while the client tracks
    at most 64 jobs, its own included (as the C++ SDK does): a burst of 65 asks for no notices,
    64 do, and one more job on top of those 64 does not."""
    x = np.arange(8, dtype=np.float32)
    with ferry.Client(fleet.frontend, fleet.redis_url) as c:
        engine = c._aio._engine
        assert_tiny(c.run("tiny", x, timeout=30), x)  # subscribes, in the background
        wait_for(lambda: engine.results._channel is not None, 10, "the notify channel")
        sent = spy_submits(engine)
        for i in c.submit_many([ferry.Job("tiny", x)] * 65):
            assert_tiny(c.wait(i, timeout=30), x)
        assert len(sent) == 1 and "notify" not in sent[0][0]
        ids = c.submit_many([ferry.Job("tiny", x)] * 64)
        assert sent[-1][0]["notify"] == engine.results._channel
        ids.append(c.submit("tiny", x))
        assert "notify" not in sent[-1][0]
        for i in ids:
            assert_tiny(c.wait(i, timeout=30), x)


def test_at_most_max_tracked_jobs_are_tracked_and_the_others_still_waited_for(fleet,
                                                                            monkeypatch):
    """The client tracks at most MAX_TRACKED submitted jobs (65,536, as the C++ SDK; 16 here):
    a producer that submits and never waits keeps bounded memory. A wait for a job past the
    cap reads Redis on its own and gets its result all the same."""
    import ferry._results
    monkeypatch.setattr(ferry._results, "MAX_TRACKED", 16)
    x = np.arange(8, dtype=np.float32)
    with ferry.Client(fleet.frontend, fleet.redis_url) as c:
        ids = c.submit_many([ferry.Job("tiny", x)] * 40)
        assert len(c._aio._engine.results.entries) == 16
        for i in ids:
            assert_tiny(c.wait(i, timeout=30), x)


def test_cancel(client):
    first = client.submit("slow", np.array([1500.0], np.float32))  # ~1.5 s on the worker
    queued = [client.submit("slow", np.array([1.0], np.float32), priority=-1) for _ in range(3)]
    unknown = uid("unknown")
    # The worker holds at most max_batch x 2 jobs; `first` blocks it, so the others may be
    # queued at the broker or held by the worker: each lands in exactly one list.
    report = client.cancel(*queued, unknown)
    assert report.not_found == [unknown]
    assert sorted(report.cancelled + report.running) == sorted(queued)
    for i in queued:
        r = client.wait(i, timeout=60)
        if i in report.cancelled:
            assert r.status == "cancelled" and r.error[0] == "cancelled"
        else:  # was on the worker: dropped there unless its batch had started
            assert r.status in ("cancelled", "done")
    assert client.wait(first, timeout=60).status == "done"
    assert client.cancel(first).not_found == [first]


def test_job_deadline_expires_a_queued_job(client):
    blockers = [client.submit("slow", np.array([800.0], np.float32)) for _ in range(3)]
    late = client.submit("tiny", np.ones(8, np.float32), timeout_ms=1)
    r = client.wait(late, timeout=60)
    # Started within 1 ms of acceptance is possible in principle only with an idle worker:
    # this one is busy with the blockers for seconds.
    assert r.status == "expired" and r.error[0] == "expired" and r.outputs == []
    for b in blockers:
        assert client.wait(b, timeout=60).status == "done"


def test_thousand_concurrent_async_runs_on_one_client(fleet):
    xs = np.random.default_rng(5).uniform(-1, 1, (1000, 8)).astype(np.float32)

    async def main():
        async with ferry.AsyncClient(fleet.frontend, fleet.redis_url) as c:
            results = await asyncio.gather(*[c.run("tiny", x, timeout=60) for x in xs])
            engine = c._engine
            engine._sweep(engine.loop.time())
            assert engine._awaiting == {}  # no handler left behind per SUBMIT
            assert engine.results.entries == {} and engine.results.held_bytes == 0  # nor per job
            return results, engine.messages_sent
    results, sent = asyncio.run(main())
    for r, x in zip(results, xs):
        assert_tiny(r, x)
    assert len({r.id for r in results}) == 1000
    assert max(r.batch_size for r in results) > 1  # the worker batched them
    assert sent < 100  # runs made in one turn of the loop travel as one SUBMIT


def test_sync_and_async_clients_in_threads(fleet):
    errors = []
    rng = np.random.default_rng(6)
    xs = rng.uniform(-1, 1, (8, 8)).astype(np.float32)
    shared = ferry.Client(fleet.frontend, fleet.redis_url)

    def sync_worker(k):
        try:
            for j in range(30):
                x = xs[(k + j) % 8]
                if j % 3 == 0:
                    assert_tiny(shared.wait(shared.submit("tiny", x), timeout=30), x)
                else:
                    assert_tiny(shared.run("tiny", x, timeout=30), x)
        except BaseException as e:  # reported below
            errors.append(e)

    def async_worker(k):
        async def main():
            async with ferry.AsyncClient(fleet.frontend, fleet.redis_url) as c:
                rs = await asyncio.gather(*[c.run("tiny", xs[j % 8], timeout=30)
                                            for j in range(100)])
                for j, r in enumerate(rs):
                    assert_tiny(r, xs[j % 8])
        try:
            asyncio.run(main())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=sync_worker, args=(k,)) for k in range(6)]
    threads += [threading.Thread(target=async_worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert errors == []
    with pytest.raises(ferry.Unavailable):
        shared.run("tiny", xs[0], timeout=5)  # closed


def test_async_api(fleet):
    async def main():
        c = ferry.AsyncClient(fleet.frontend, fleet.redis_url)
        x = np.ones(8, np.float32)
        i = await c.submit("tiny", x)
        assert_tiny(await c.wait(i, timeout=30), x)
        assert_tiny(await c.poll(i), x)
        ids = await c.submit_many([ferry.Job("tiny", x) for _ in range(5)])
        for r in await asyncio.gather(*[c.wait(i, timeout=30) for i in ids]):
            assert_tiny(r, x)
        assert (await c.cancel(uid("gone"))).not_found
        assert (await c.stats())["workers"]
        with pytest.raises(ferry.UnknownModel):
            await c.run("nope", x, timeout=10)
        # A caller that gives up (asyncio cancellation) leaves the client working.
        task = asyncio.ensure_future(c.run("slow", np.array([300.0], np.float32)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_tiny(await c.run("tiny", x, timeout=30), x)
        await c.close()
    asyncio.run(main())


def test_no_broker_means_unavailable_not_a_hang():
    with ferry.Client("tcp://127.0.0.1:9", "redis://127.0.0.1:9", request_timeout_ms=300) as c:
        with pytest.raises(ferry.Unavailable) as e:
            c.run("tiny", np.ones(8, np.float32), timeout=0.3)
        assert "not sent" in str(e.value) and e.value.retryable
        with pytest.raises(ferry.Unavailable):
            c.submit("tiny", np.ones(8, np.float32))
        with pytest.raises(ferry.Unavailable):
            c.poll(uid("x"))  # no Redis either


def test_tls_to_a_plain_redis_port_says_why(fleet):
    # rediss:// to a plain-TCP Redis: the handshake fails, and the message says why and what to
    # do (before, a timed-out handshake left it empty: "Redis at HOST:PORT: ").
    url = fleet.redis_url.replace("redis://", "rediss://", 1)
    with ferry.Client(fleet.frontend, url, request_timeout_ms=1000) as c:
        with pytest.raises(ferry.Unavailable) as e:
            c.poll(uid("tls"))
    assert "is it a plain-TCP port? use redis://" in str(e.value), e.value


def test_a_socket_that_cannot_open_says_why_and_leaves_nothing_open(tmp_path):
    """Checked in a process of its own: the file descriptors this one's clients and fleet open
    in the background would blur the count."""
    public, _ = zmq.auth.create_certificates(str(tmp_path), "client")
    script = """
import os, sys
import ferry
cases = [
    (dict(curve_server_public=sys.argv[1] + ".missing", curve_secret=sys.argv[1]),
     "CURVE certificates"),
    (dict(curve_server_public=sys.argv[1], curve_secret=sys.argv[1]), "holds no secret key"),
    (dict(frontend="nonsense://x"), "frontend endpoint"),
]
opened = len(os.listdir("/proc/self/fd"))
for kwargs, why in cases * 5:
    args = dict(frontend="tcp://127.0.0.1:1", redis="redis://127.0.0.1:1")
    args.update(kwargs)
    try:
        ferry.Client(**args)
        sys.exit("no error for %r" % kwargs)
    except ferry.InvalidArgument as e:
        assert why in str(e), (why, str(e))
print(opened, len(os.listdir("/proc/self/fd")))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script, public], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == before, "left open: %s" % out.stdout  # no context, socket or monitor
