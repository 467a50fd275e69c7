"""The clients against a real fleet (redis-server, ferry-broker, ferry-worker)."""

import asyncio
import threading
import time
import uuid

import numpy as np
import pytest

import ferry
from conftest import assert_tiny
from fleet import wait_for


def uid(tag):
    return "py-%s-%s" % (tag, uuid.uuid4().hex[:12])


@pytest.fixture
def client(fleet):
    with ferry.Client(fleet.frontend, fleet.redis_url) as c:
        yield c


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


def test_stored_inputs_go_through_redis(fleet, client):
    """Inputs of >= 64 KiB go to Redis (ferry:input:ID:I) before the SUBMIT; the worker reads
    and deletes them. null returns the input: the 80 KB output comes back by GET."""
    r_before = fleet.redis().info("commandstats").get("cmdstat_set", {}).get("calls", 0)
    x = np.random.default_rng(4).standard_normal(20000).astype(np.float32)  # 80,000 bytes
    small = np.arange(8, dtype=np.float32)
    r = client.run("null", x, timeout=30)
    np.testing.assert_array_equal(r.outputs[0], x)
    i = client.submit("null", x)
    np.testing.assert_array_equal(client.wait(i, timeout=30).outputs[0], x)
    calls = fleet.redis().info("commandstats")["cmdstat_set"]["calls"]
    assert calls - r_before >= 2  # the two stored inputs (results are written with SET too)
    assert fleet.redis().keys("ferry:input:*") == []
    with ferry.Client(fleet.frontend, fleet.redis_url, stored_input_bytes=0,
                      attached_input_bytes=0) as inline:
        np.testing.assert_array_equal(inline.run("null", x, timeout=30).outputs[0], x)
    # Two inputs, one stored and one not, in one job (multi wants [4] and [3]: model_error,
    # but the stored one was read and deleted all the same).
    with ferry.Client(fleet.frontend, fleet.redis_url, stored_input_bytes=16) as c:
        r = c.run("multi", np.ones(4, np.float32), np.arange(3), timeout=30)
        assert r.status == "done" and int(r.outputs[1]) == 3
    # A rejected job's stored inputs are deleted by the client.
    with pytest.raises(ferry.UnknownModel):
        client.submit("nope", x)
    with pytest.raises(ferry.UnknownModel):
        client.run("nope", x, timeout=30)
    wait_for(lambda: fleet.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted")
    assert_tiny(client.run("tiny", small, timeout=30), small)


def test_redis_over_its_unix_socket(fleet):
    """unix:///path: the client reaches Redis over its Unix-domain socket (for producers on
    Redis's host); results, notices and stored inputs all go through it."""
    url = "unix://" + fleet.redis_socket
    x = np.random.default_rng(5).standard_normal(20000).astype(np.float32)  # stored: 80 KB
    small = np.arange(8, dtype=np.float32)
    with ferry.Client(fleet.frontend, url, **fleet.client_options()) as c:
        np.testing.assert_array_equal(c.run("null", x, timeout=30).outputs[0], x)
        assert_tiny(c.run("tiny", small, timeout=30), small)
        i = c.submit("null", x)
        np.testing.assert_array_equal(c.wait(i, timeout=30).outputs[0], x)
        # A Unix client's addr: "PATH:0" (Redis 7), "[PATH:0]:0" (Valkey 9).
        on_socket = [cl for cl in fleet.redis().client_list()
                     if cl["addr"].lstrip("[").startswith(fleet.redis_socket + ":")]
        assert on_socket, fleet.redis().client_list()
    assert fleet.redis().keys("ferry:input:*") == []
    # Nobody on the socket: a stored input cannot be written, and the error says where.
    with ferry.Client(fleet.frontend, "unix://" + fleet.dir + "/none.sock",
                      **fleet.client_options()) as c:
        with pytest.raises(ferry.Unavailable, match="unix:" + fleet.dir + "/none.sock"):
            c.run("null", x, timeout=5)


def test_big_replies_are_read_into_buffers_of_their_own(fleet, monkeypatch):
    """Redis replies of 64 KiB or more are read straight into a bytearray of their size, and a
    big result's outputs are views of it (no copies): replies of every size around that bound,
    pipelined with small ones on one connection, come back whole and in order; big outputs
    come back writable."""
    import asyncio
    sizes = [0, 1, 65535, 65536, 65537, 300001, 1 << 20]
    values = [bytes(np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8))
              for n in sizes]

    async def main():
        c = ferry.AsyncClient(fleet.frontend, fleet.redis_url, **fleet.client_options())
        redis = c._get_engine().redis
        for n, v in zip(sizes, values):
            assert await redis.execute("SET", "t:big:%d" % n, v) == "OK"
        keys = ["t:big:%d" % n for n in sizes]
        replies = await asyncio.gather(*[redis.execute("GET", k) for k in keys + ["t:none"]
                                         + keys[::-1]])
        assert replies[len(keys)] is None
        for got, want in zip(replies[:len(keys)] + replies[len(keys) + 1:][::-1], values * 2):
            assert got == want
            assert isinstance(got, bytearray if len(want) >= 65536 else bytes)
        # Through a worker: null returns its input, so each output is as big as its input.
        xs = [np.random.default_rng(i).standard_normal(n).astype(np.float32)
              for i, n in enumerate([8, 300000, 20000, 250001, 8, 17000])]
        results = await asyncio.gather(*[c.run("null", x, timeout=30) for x in xs])
        for x, r in zip(xs, results):
            y = r.outputs[0]
            np.testing.assert_array_equal(y, x)
            assert y.flags.writeable and y.flags.aligned
            y += 1  # the caller's own array
        await c.close()

    asyncio.run(main())
    # Above _MAX_BIG_BULK a reply is read as it arrives, into the connection's growing buffer.
    from ferry import _resp
    monkeypatch.setattr(_resp, "_MAX_BIG_BULK", 100000)

    async def over_the_bound():
        c = ferry.AsyncClient(fleet.frontend, fleet.redis_url, **fleet.client_options())
        redis = c._get_engine().redis
        got = await asyncio.gather(*[redis.execute("GET", "t:big:%d" % n) for n in sizes])
        for g, want in zip(got, values):
            assert g == want
            assert isinstance(g, bytearray if 65536 <= len(want) <= 100000 else bytes)
        await c.close()

    asyncio.run(over_the_bound())
    fleet.redis().delete(*["t:big:%d" % n for n in sizes])


def spy_submits(engine):
    """Records each SUBMIT the engine sends: (its body, its data frames as sent)."""
    import msgpack
    sent = []
    send = engine._send

    def spy(command, body, frames=(), *rest):
        if command == b"SUBMIT":
            sent.append((msgpack.unpackb(body), list(frames)))
        return send(command, body, frames, *rest)
    engine._send = spy
    return sent


def attached_of(body):
    """The (job id, input index) of every attached tensor of a SUBMIT body, in frame order."""
    return [(j["id"], k) for j in body["jobs"] for k, t in enumerate(j["inputs"])
            if t.get("attached")]


def test_attached_inputs_travel_in_frames_of_their_own(fleet, client):
    """Inputs of 16 KiB up to stored_input_bytes go as data frames after the SUBMIT body
    (protocol.md, "Attached inputs"); null returns its input, so each job's bytes come back."""
    sent = spy_submits(client._aio._engine)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(10000).astype(np.float32)  # 40,000 bytes
    np.testing.assert_array_equal(client.run("null", x, timeout=30).outputs[0], x)
    body, frames = sent[-1]
    assert body["jobs"][0]["inputs"] == [{"dtype": "float32", "shape": [10000], "attached": True}]
    assert [bytes(f) for f in frames] == [x.tobytes()]
    i = client.submit("null", x[::-1])  # not contiguous: attached from a contiguous copy
    np.testing.assert_array_equal(client.wait(i, timeout=30).outputs[0], x[::-1])
    assert len(sent[-1][1]) == 1
    # Frames of 64 KiB and more are sent from the caller's array itself (pyzmq, copy=False).
    with ferry.Client(fleet.frontend, fleet.redis_url, stored_input_bytes=1 << 20) as big:
        sent = spy_submits(big._aio._engine)
        y = rng.standard_normal((250, 400)).astype(np.float32)  # 400,000 bytes
        np.testing.assert_array_equal(big.run("null", y, timeout=30).outputs[0], y)
        frames = sent[-1][1]
        assert len(frames) == 1 and np.shares_memory(np.frombuffer(frames[0], np.uint8), y)
    # attached_input_bytes=0: in the body, as before.
    with ferry.Client(fleet.frontend, fleet.redis_url, attached_input_bytes=0) as inline:
        sent = spy_submits(inline._aio._engine)
        np.testing.assert_array_equal(inline.run("null", x, timeout=30).outputs[0], x)
        body, frames = sent[-1]
        assert frames == [] and body["jobs"][0]["inputs"][0]["data"] == x.tobytes()
    with pytest.raises(ferry.InvalidArgument):
        ferry.Client(fleet.frontend, fleet.redis_url, attached_input_bytes=-1)
    assert fleet.redis().keys("ferry:input:*") == []


def test_one_submit_mixes_inline_attached_and_stored_inputs(fleet, client):
    """One SUBMIT (submit_many) with inputs in the body, attached and stored, across jobs,
    with two rejected jobs that carry frames in the middle: every accepted job gets its own
    bytes back (one frame out of place would give a job another's bytes or a size error)."""
    sent = spy_submits(client._aio._engine)
    rng = np.random.default_rng(8)
    a1, a2, a3 = (rng.standard_normal(6000).astype(np.float32) for _ in range(3))  # 24,000 B
    a4 = rng.integers(-30000, 30000, 12000).astype(np.int16)                         # 24,000 B
    small = rng.standard_normal(8).astype(np.float32)
    stored = rng.standard_normal(20000).astype(np.float32)                           # 80,000 B
    short = ferry.Tensor(a1, "float32")
    short.data = short.data[:-4]  # a frame 4 bytes short of its shape: rejected alone
    jobs = [ferry.Job("null", small), ferry.Job("null", a1), ferry.Job("nope", a2),
            ferry.Job("null", stored), ferry.Job("null", short), ferry.Job("null", a3),
            ferry.Job("null", a4)]
    with pytest.raises(ferry.UnknownModel) as e:
        client.submit_many(jobs)
    ids = e.value.ids
    assert len(sent) == 1  # one SUBMIT
    body, frames = sent[0]
    assert attached_of(body) == [(ids[k], 0) for k in (1, 2, 4, 5, 6)]
    assert [bytes(f) for f in frames] == [a1.tobytes(), a2.tobytes(), short.data,
                                          a3.tobytes(), a4.tobytes()]
    assert body["jobs"][0]["inputs"][0]["data"] == small.tobytes()
    assert body["jobs"][3]["inputs"][0]["stored"] is True
    assert e.value.accepted == [ids[k] for k in (0, 1, 3, 5, 6)]
    assert e.value.errors[ids[2]].code == "unknown_model"
    assert e.value.errors[ids[4]].code == "invalid_argument"
    for k, x in ((0, small), (1, a1), (3, stored), (5, a3), (6, a4)):
        r = client.wait(ids[k], timeout=30)
        assert r.status == "done", r
        assert r.outputs[0].dtype == x.dtype
        np.testing.assert_array_equal(r.outputs[0], x)
    # Two inputs of one job, one attached and one stored (multi: 2a + 1 and sum(b)), twice in
    # one SUBMIT, and once through run.
    with ferry.Client(fleet.frontend, fleet.redis_url, attached_input_bytes=16,
                      stored_input_bytes=24) as c:
        sent = spy_submits(c._aio._engine)
        pairs = [(rng.standard_normal(4).astype(np.float32), np.arange(3) * k) for k in (1, 7)]
        ids = c.submit_many([ferry.Job("multi", a, b) for a, b in pairs])
        body, frames = sent[-1]
        assert attached_of(body) == [(ids[0], 0), (ids[1], 0)]
        assert [j["inputs"][1]["stored"] for j in body["jobs"]] == [True, True]
        for i, (a, b) in zip(ids, pairs):
            r = c.wait(i, timeout=30)
            np.testing.assert_array_equal(r.outputs[0], 2 * a + 1)
            assert int(r.outputs[1]) == b.sum()
        r = c.run("multi", pairs[1][0], pairs[0][1], timeout=30)
        np.testing.assert_array_equal(r.outputs[0], 2 * pairs[1][0] + 1)
        assert int(r.outputs[1]) == 3
    wait_for(lambda: fleet.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted")


def test_async_runs_batched_into_one_submit_keep_their_frames_in_order(fleet):
    """Runs started in one loop turn travel as one SUBMIT ("ack": false): its data frames are
    the attached inputs of its jobs in job order, whatever mix of inline, attached and stored
    inputs they have, and every run gets its own bytes back."""
    rng = np.random.default_rng(9)
    xs = []
    for k in range(24):
        kind = k % 4
        if kind == 0:
            xs.append(rng.standard_normal(8).astype(np.float32))        # in the body
        elif kind == 3:
            xs.append(rng.standard_normal(20000).astype(np.float32))    # stored
        else:
            xs.append(rng.standard_normal(5000 + 1000 * (k % 3)).astype(np.float32))  # attached

    async def main(**options):
        async with ferry.AsyncClient(fleet.frontend, fleet.redis_url, **options) as c:
            sent = spy_submits(c._engine)
            results = await asyncio.gather(*[c.run("null", x, timeout=60) for x in xs])
            return results, sent

    results, sent = asyncio.run(main())
    for r, x in zip(results, xs):
        assert r.status == "done", r
        np.testing.assert_array_equal(r.outputs[0], x)
    by_id = {r.id: x for r, x in zip(results, xs)}
    assert len(sent) < len(xs)  # batched
    assert sum(len(b["jobs"]) > 1 for b, _ in sent) >= 1
    nframes = 0
    for body, frames in sent:
        assert body["ack"] is False
        order = attached_of(body)
        assert [bytes(f) for f in frames] == [by_id[i].tobytes() for i, _ in order]
        nframes += len(frames)
    assert nframes == 12  # k % 4 in (1, 2): resubmissions would add some; none expected
    results, sent = asyncio.run(main(attached_input_bytes=0))
    for r, x in zip(results, xs):
        np.testing.assert_array_equal(r.outputs[0], x)
    assert all(frames == [] for _, frames in sent)


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


def _done_record(y, model, worker):
    """A done result record (msgpack) with the one float32 output `y`, as a worker writes it."""
    import msgpack
    return msgpack.packb({"status": "done", "model": model, "worker": worker, "batch_size": 1,
                          "attempt": 1, "timing": {},
                          "outputs": [{"dtype": "float32", "shape": list(y.shape),
                                       "data": y.tobytes()}]})


def _run_against_a_stub_broker(fleet, prefix, x, y, on_submit):
    """c.run("tiny", x) against a stub broker: a ROUTER on a thread. For each SUBMIT,
    on_submit(n, body, reply, serve) (n counts from 1): reply(command, body) answers on the
    socket; serve(job_id) answers as a worker does: SET the record (output y), then PUBLISH
    the notice (record inline) on the job's notify channel, or send FINISHED without one.
    Returns (the result, the SUBMIT bodies, their data frames)."""
    import msgpack
    import zmq
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen, seen_frames, stop = [], [], threading.Event()
    store = fleet.redis()
    record = _done_record(y, "tiny", "stub")

    def serve_loop():
        while not stop.is_set():
            if not router.poll(50):
                continue
            peer, tag, command, body, *frames = router.recv_multipart()
            body = msgpack.unpackb(body)
            seen.append(body)
            seen_frames.append(frames)

            def reply(command, answer):
                router.send_multipart([peer, tag, command, msgpack.packb(answer)])

            def serve(job_id):
                store.set(prefix + "result:" + job_id, record)
                notice = msgpack.packb({"ids": [job_id], "results": {job_id: record}})
                if body.get("notify"):
                    store.publish(body["notify"], notice)
                else:
                    router.send_multipart([peer, tag, b"FINISHED", notice])
            on_submit(len(seen), body, reply, serve)
    t = threading.Thread(target=serve_loop)
    t.start()
    try:
        with ferry.Client("tcp://127.0.0.1:%d" % port, fleet.redis_url, redis_prefix=prefix,
                          request_timeout_ms=300) as c:
            r = c.run("tiny", x, timeout=30)
    finally:
        stop.set()
        t.join()
        router.close(0)
        ctx.term()
    return r, seen, seen_frames


def test_run_resubmits_the_same_id_after_silence_and_takes_the_notice(fleet):
    """A stub broker drops the first SUBMIT (as a broker that crashed before journaling it
    would): after request_timeout_ms without a result the client GETs the result, finds none
    and sends the same id again, its attached input's data frame too. By then its notify
    channel is subscribed, so the stub answers the way a worker does: SET the record, PUBLISH
    the notice (record inline) on the channel."""
    y = np.array([4.0, 2.0], np.float32)
    x = np.arange(5000, dtype=np.float32)  # 20,000 bytes: attached

    def on_submit(n, body, reply, serve):
        if n > 1:  # the first: silence
            serve(body["jobs"][0]["id"])
    r, seen, seen_frames = _run_against_a_stub_broker(fleet, "pystub:", x, y, on_submit)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert r.worker == "stub"
    assert len(seen) == 2
    assert seen[0]["jobs"][0]["id"] == seen[1]["jobs"][0]["id"] == r.id
    assert seen[0]["ack"] is False and seen[1]["ack"] is False
    assert seen[0]["inline_results"] is True
    assert seen[1]["notify"].startswith("pystub:notify:")
    assert seen_frames == [[x.tobytes()], [x.tobytes()]]
    assert seen[1]["jobs"][0]["inputs"][0] == {"dtype": "float32", "shape": [5000],
                                               "attached": True}


def test_a_late_rejection_of_a_run_resubmitted_since_does_not_fail_it(fleet):
    """A stub broker keeps the first SUBMIT of a run unanswered past request_timeout_ms, so the
    client sends the same id again; only then does it reject the first one (queue_full, rid 1),
    and it takes the second silently (accepted) and serves its result. The run returns that
    result: a rejection counts only from the job's latest SUBMIT. (Before, it raised QueueFull
    and deleted the stored input that the accepted job was still to read.)"""
    store = fleet.redis()
    y = np.array([1.0, 2.0], np.float32)
    x = np.arange(50000, dtype=np.float32)  # 200,000 bytes: stored in Redis
    first = {}

    def on_submit(n, body, reply, serve):
        if n == 1:
            first["rid"] = body["rid"]  # silence: the client sends it again
        elif n == 2:
            job_id = body["jobs"][0]["id"]
            reply(b"ACCEPTED", {"rid": first["rid"], "ids": [], "rejected": [
                {"id": job_id, "code": "queue_full", "message": "full"}]})
            time.sleep(0.5)  # the rejection is read first (a client that took it has raised)
            serve(job_id)
        # later ones: a resubmit of an accepted job, which the broker answers duplicate
    r, seen, _ = _run_against_a_stub_broker(fleet, "pylate:", x, y, on_submit)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert len(seen) >= 2 and seen[0]["rid"] != seen[1]["rid"]
    assert seen[1]["jobs"][0]["inputs"][0]["stored"] is True
    assert store.exists("pylate:input:%s:0" % r.id), "the accepted job's input was deleted"


def test_more_than_max_jobs_per_message_go_in_several_submits(fleet):
    """The broker refuses a SUBMIT of more than --max-jobs-per-message (10,000) jobs, or a
    CANCEL of more ids, as a whole (too_large): submit_many, cancel and runs started in one
    turn are split at 10,000 jobs too. Two
    models: each queue stays under the broker's --max-queue (10,000)."""
    n = 10001
    x = np.ones(8, np.float32)

    async def main():
        async with ferry.AsyncClient(fleet.frontend, fleet.redis_url) as c:
            sent = spy_submits(c._engine)
            ids = await c.submit_many([ferry.Job("tiny" if k % 2 else "null", x)
                                       for k in range(n)])
            assert len(set(ids)) == n
            done = await asyncio.gather(*[c.wait(i, timeout=60) for i in ids])
            assert {r.status for r in done} == {"done"}
            submits = [len(b["jobs"]) for b, _ in sent]
            assert sum(submits) == n and max(submits) == 10000
            report = await c.cancel(ids)  # one CANCEL per 10,000 ids: every id in one list
            assert sorted(report.cancelled + report.running + report.not_found) == sorted(ids)
            del sent[:]
            runs = await asyncio.gather(*[c.run("tiny" if k % 2 else "null", x, timeout=60)
                                          for k in range(n)])
            assert {r.status for r in runs} == {"done"}
            assert sum(len(b["jobs"]) for b, _ in sent) == n
            assert max(len(b["jobs"]) for b, _ in sent) <= 10000
    asyncio.run(main())


def test_an_unavailable_rejection_keeps_the_stored_inputs(fleet):
    """The broker dispatches a job before its journal write; when that write fails it rejects
    the job `unavailable`, but the worker has it: its stored inputs must stay (the worker
    reads, then deletes them). HSET denied to the broker's Redis user fails the journal write;
    the stopped worker holds the job unread until then."""
    import signal
    r = fleet.redis()
    x = np.arange(40000, dtype=np.float32)  # 160 KB: stored
    worker = fleet.worker_procs[0]
    with ferry.Client(fleet.frontend, fleet.redis_url, push_results=False) as c:
        assert c.run("null", x, timeout=30).status == "done"
        sid, rid = uid("unavail-submit"), uid("unavail-run")
        r.execute_command("ACL", "SETUSER", "default", "-hset")
        worker.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(ferry.Unavailable):
                c.submit("null", x, id=sid)
            # run: backs off and resubmits the same id until its timeout, then raises.
            with pytest.raises(ferry.Unavailable):
                c.run("null", x, id=rid, timeout=0.5)
            c.poll(uid("flush"))  # after any DEL the client issued, on the same connection
            assert r.exists("ferry:input:%s:0" % sid) == 1
            assert r.exists("ferry:input:%s:0" % rid) == 1
        finally:
            r.execute_command("ACL", "SETUSER", "default", "+hset")
            worker.send_signal(signal.SIGCONT)
        for i in (sid, rid):
            res = c.wait(i, timeout=30)  # the worker ran it with its inputs
            assert res.status == "done", res
            np.testing.assert_array_equal(res.outputs[0], x)


def test_consuming_waiters_share_a_result_too_big_to_come_inline(fleet):
    """consume_results: the one read that gets a big record (then deleted) hands it to the
    other waiters; close() makes the deletion's last round trip."""
    x = np.arange(40000, dtype=np.float32)  # 160 KB out: read from Redis, not inline

    async def main():
        async with ferry.AsyncClient(fleet.frontend, fleet.redis_url,
                                     consume_results=True) as c:
            i = await c.submit("null", x)
            rs = await asyncio.gather(*[c.wait(i, timeout=3) for _ in range(3)])
            for r in rs:
                assert r.status == "done" and r.id == i
                np.testing.assert_array_equal(r.outputs[0], x)
            assert len({id(r.outputs[0]) for r in rs}) == 3  # each its own arrays
            assert c._engine.results.held_bytes == 0 and c._engine.results.entries == {}
            return i
    i = asyncio.run(main())
    assert fleet.redis().exists("ferry:result:" + i) == 0


def swallowing_broker():
    """A ROUTER that reads every message and answers none: (its frontend, what it got, stop)."""
    import zmq
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    got, done = [], threading.Event()

    def serve():
        while not done.is_set():
            if router.poll(20):
                got.append(router.recv_multipart())
        router.close(0)
        ctx.term()
    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def stop():
        done.set()
        t.join(5)
    return "tcp://127.0.0.1:%d" % port, got, stop


def test_close_ends_the_calls_other_threads_wait_in():
    """Client.close() while other threads wait for the broker's answer (submit, submit_many,
    stats) or a result (run): each raises Unavailable at once, none waits for
    request_timeout_ms (20 s here). AsyncClient.close() ends an awaited submit the same way."""
    frontend, got, stop = swallowing_broker()
    x = np.ones(8, np.float32)
    try:
        c = ferry.Client(frontend, "redis://127.0.0.1:9", request_timeout_ms=20000,
                         push_results=False)
        calls = {"submit": lambda: c.submit("tiny", x),
                 "submit_many": lambda: c.submit_many([ferry.Job("tiny", x)] * 2),
                 "run": lambda: c.run("tiny", x, timeout=20),
                 "stats": c.stats}
        out = {}

        def call(name):
            try:
                out[name] = calls[name]()
            except BaseException as e:  # noqa: B902 (checked below)
                out[name] = e
        threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in calls]
        for t in threads:
            t.start()
        wait_for(lambda: len(got) >= 3, 10, "the requests at the stub")  # 2 submits may be 1
        t0 = time.monotonic()
        c.close()
        for t in threads:
            t.join(5)
        assert time.monotonic() - t0 < 5
        for k in calls:
            assert isinstance(out.get(k), ferry.Unavailable), (k, out.get(k))
            assert "closed" in str(out[k])
        with pytest.raises(ferry.Unavailable):
            c.submit("tiny", x)

        async def main():
            a = ferry.AsyncClient(frontend, "redis://127.0.0.1:9", request_timeout_ms=20000)
            task = asyncio.ensure_future(a.submit("tiny", x))
            n = len(got)
            while len(got) == n:
                await asyncio.sleep(0.01)
            await a.close()
            with pytest.raises(ferry.Unavailable):
                await asyncio.wait_for(task, 5)
        asyncio.run(main())
    finally:
        stop()


def test_a_submit_never_sent_deletes_its_stored_inputs(fleet):
    """No broker took the SUBMIT (none listens there): at the timeout its jobs' stored inputs
    are deleted, as run's are; they would otherwise stay for input_ttl_s."""
    from fleet import free_port
    x = np.arange(40000, dtype=np.float32)  # stored
    prefix = "pyunsent-%s:" % uuid.uuid4().hex[:8]
    r = fleet.redis()
    with ferry.Client("tcp://127.0.0.1:%d" % free_port(), fleet.redis_url, redis_prefix=prefix,
                      request_timeout_ms=300, push_results=False) as c:
        with pytest.raises(ferry.Unavailable):
            c.submit("null", x, id=uid("unsent"))
        with pytest.raises(ferry.Unavailable):
            c.submit_many([ferry.Job("null", x), ferry.Job("null", x)])
        with pytest.raises(ferry.Unavailable):
            c.run("null", x, timeout=0.3)
        c.poll(uid("flush"))  # after the DELs, on the same connection
        assert r.keys(prefix + "*") == []


def test_close_mid_run_opens_no_redis_connection(fleet):
    """AsyncClient.close() while a run with stored inputs waits for a broker: the run raises
    Unavailable, its inputs are deleted before the Redis connection closes, and nothing opens
    a connection after close."""
    from fleet import free_port
    x = np.arange(40000, dtype=np.float32)
    prefix = "pyclosed-%s:" % uuid.uuid4().hex[:8]
    r = fleet.redis()

    async def main():
        c = ferry.AsyncClient("tcp://127.0.0.1:%d" % free_port(), fleet.redis_url,
                              redis_prefix=prefix, push_results=False)
        task = asyncio.ensure_future(c.run("null", x, timeout=30))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if r.keys(prefix + "input:*"):
                break
        assert len(r.keys(prefix + "input:*")) == 1
        commands = c._engine.redis
        await c.close()
        with pytest.raises(ferry.Unavailable) as e:
            await task
        await asyncio.sleep(0.2)  # what the run's end started
        assert commands._conn is None or commands._conn.closed
        assert commands._connecting is None
        with pytest.raises(ferry.Unavailable):
            await commands.execute("PING")
        assert commands._conn is None or commands._conn.closed
        assert "closed" in str(e.value)
    asyncio.run(main())
    assert r.keys(prefix + "*") == []


def _store_result(r, key, y):
    """Writes a done result record with output `y` under `key`, as a worker does."""
    r.set(key, _done_record(y, "m", "w"))


def test_a_consuming_read_cut_off_keeps_the_result(fleet):
    """consume_results: a read that Redis cuts off (here its reply is over the client output
    buffer limit, so it closes the connection) deletes nothing: the next wait gets the result,
    and only then is it deleted. (With GETDEL as the read, Redis deleted the record before the
    reply was lost, and it was gone for good.)"""
    r = fleet.redis()
    i = uid("cut")
    y = np.arange(262144, dtype=np.float32)  # 1 MiB
    _store_result(r, "ferry:result:" + i, y)
    with ferry.Client(fleet.frontend, fleet.redis_url, consume_results=True) as c:
        r.config_set("client-output-buffer-limit", "normal 65536 65536 0")
        try:
            with pytest.raises(ferry.Unavailable):
                c.wait(i, timeout=0.5)
        finally:
            r.config_set("client-output-buffer-limit", "normal 0 0 0")
        got = c.wait(i, timeout=30)
        np.testing.assert_array_equal(got.outputs[0], y)
        assert r.exists("ferry:result:" + i) == 0, "the read that got it did not delete it"


def test_consumed_results_are_deleted_by_a_user_that_may_only_getdel_them(fleet):
    """A producer ACL user set up before this client (GETDEL on results, not DEL): the DEL of
    consumed results gets NOPERM, and the client deletes them with GETDEL instead."""
    r = fleet.redis()
    user, pw = "py-nodel-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    r.execute_command("ACL", "SETUSER", user, "on", ">" + pw, "~*", "&*", "+@all", "-del")
    url = "redis://%s:%s@127.0.0.1:%d" % (user, pw, fleet.redis_port)
    ids = [uid("getdel") for _ in range(3)]
    y = np.ones(4, np.float32)
    for i in ids:
        _store_result(r, "ferry:result:" + i, y)
    def getdels():
        return r.info("commandstats").get("cmdstat_getdel", {}).get("calls", 0)
    before = getdels()
    try:
        with ferry.Client(fleet.frontend, url, consume_results=True) as c:
            for i in ids:
                np.testing.assert_array_equal(c.wait(i, timeout=30).outputs[0], y)
            assert wait_for(lambda: not any(r.exists("ferry:result:" + i) for i in ids), 10)
        assert getdels() - before >= len(ids)
    finally:
        r.execute_command("ACL", "DELUSER", user)


def test_a_redis_error_reply_fails_the_wait_at_once(fleet):
    """Redis refusing the read (NOPERM here: an ACL user without GET) is no outage to
    wait out: wait raises FerryError(internal) at once, also with timeout=None."""
    r = fleet.redis()
    user, pw = "py-noread-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    r.execute_command("ACL", "SETUSER", user, "on", ">" + pw, "~*", "&*", "+@all", "-get",
                      "-getdel")
    url = "redis://%s:%s@127.0.0.1:%d" % (user, pw, fleet.redis_port)
    try:
        for consume in (False, True):
            with ferry.Client(fleet.frontend, url, consume_results=consume) as c:
                # Retried as an outage, the first wait would raise Unavailable at its timeout
                # and the second never end (the join's bound is a liveness check only).
                for timeout in (60, None):
                    out = {}

                    def wait():
                        try:
                            c.wait(uid("denied"), timeout=timeout)
                        except BaseException as e:  # noqa: B902 (checked below)
                            out["error"] = e
                    t = threading.Thread(target=wait, daemon=True)
                    t.start()
                    t.join(120)
                    assert not t.is_alive(), "the wait did not end"
                    err = out["error"]
                    assert type(err) is ferry.FerryError and err.code == "internal", err
                    assert "NOPERM" in str(err)
                with pytest.raises(ferry.FerryError) as e:
                    c.poll(uid("denied"))
                assert e.value.code == "internal"
    finally:
        r.execute_command("ACL", "DELUSER", user)
