"""Big inputs and results through a real fleet: stored (the claim check), attached (frames
of their own), Redis over its Unix-domain socket, big replies."""

import asyncio

import numpy as np
import pytest

import ferry
from conftest import assert_tiny, spy_submits
from fleet import wait_for


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
    # (the worker deletes them in the round after the results: a moment after they are read)
    wait_for(lambda: fleet.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted")
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
    # (the worker deletes them in the round after the results: a moment after they are read)
    wait_for(lambda: fleet.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted")
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
    # (the worker deletes them in the round after the results: a moment after they are read)
    wait_for(lambda: fleet.redis().keys("ferry:input:*") == [], 10, "stored inputs deleted")


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
