"""The clients when a peer misbehaves or goes away: a stub broker that drops, answers late or
rejects late, close() while calls wait. Redis cut off, refusing or stalled:
test_client_redis_faults.py."""

import asyncio
import contextlib
import threading
import time
import uuid

import numpy as np
import pytest

import ferry
from conftest import answered_limits, done_record, spy_submits, stub_broker, uid
from fleet import wait_for


def _run_against_a_stub_broker(fleet, prefix, x, y, on_submit):
    """c.run("tiny", x) against a stub broker. For each SUBMIT, on_submit(n, body, reply,
    serve) (n counts from 1): reply(command, body) answers on the socket; serve(job_id) answers
    as a worker does: SET the record (output y), then PUBLISH the notice (record inline) on the
    job's notify channel, or send FINISHED without one. Returns (the result, the SUBMIT
    bodies, their data frames)."""
    import msgpack
    seen, seen_frames = [], []
    store = fleet.redis()
    record = done_record(y, "tiny", "stub")

    def handle(router, message):
        peer, tag, command, body, *frames = message
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
    with stub_broker(handle) as frontend:
        with ferry.Client(frontend, fleet.redis_url, redis_prefix=prefix,
                          request_timeout_ms=300) as c:
            r = c.run("tiny", x, timeout=30)
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


def test_a_run_resubmitted_after_silences_writes_its_stored_input_once(fleet):
    """Each silence of request_timeout_ms resubmits the run's SUBMIT, not its stored input: the
    200 KB written before the first SUBMIT are still in Redis (a job queued for long would
    otherwise have its inputs uploaded again every 300 ms, loading Redis when it is busiest)."""
    store = fleet.redis()
    y = np.array([1.0, 2.0], np.float32)
    x = np.arange(50000, dtype=np.float32)  # 200,000 bytes: stored in Redis
    sets_before = store.info("commandstats")["cmdstat_set"]["calls"]

    def on_submit(n, body, reply, serve):
        if n == 4:  # three silences first
            serve(body["jobs"][0]["id"])
    r, seen, _ = _run_against_a_stub_broker(fleet, "pyonce:", x, y, on_submit)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert len(seen) >= 4
    assert all(b["jobs"][0]["inputs"][0]["stored"] is True for b in seen)
    sets = store.info("commandstats")["cmdstat_set"]["calls"] - sets_before
    assert sets == 2, "%d SETs: the input once and the stub's result once" % sets
    assert store.get("pyonce:input:%s:0" % r.id) == x.tobytes()


def test_a_run_resubmitted_after_its_stored_input_vanished_writes_it_again(fleet):
    """A resubmit renews the stored input's expiry (EXPIRE) rather than uploading it again; an
    input Redis no longer has (here deleted after the first resubmit, as a Redis restarted
    without persistence or an eviction would lose it) is written again before the next one, so
    that the worker that takes the resubmitted job finds it."""
    store = fleet.redis()
    y = np.array([3.0, 1.0], np.float32)
    x = np.arange(50000, dtype=np.float32)  # 200,000 bytes: stored in Redis
    stats = lambda: store.info("commandstats")  # noqa: E731
    calls = lambda command: stats().get("cmdstat_" + command, {"calls": 0})["calls"]  # noqa: E731
    sets_before, expires_before = calls("set"), calls("expire")
    present = []

    def on_submit(n, body, reply, serve):
        key = "pylost:input:%s:0" % body["jobs"][0]["id"]
        present.append(store.exists(key))
        if n == 2:
            store.delete(key)
        if n == 4:
            serve(body["jobs"][0]["id"])
    r, seen, _ = _run_against_a_stub_broker(fleet, "pylost:", x, y, on_submit)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert present == [1, 1, 1, 1], "each SUBMIT went out with its input in Redis: %s" % present
    sets = calls("set") - sets_before
    assert sets == 3, "%d SETs: the input, once more after it vanished, the result" % sets
    assert calls("expire") - expires_before == 3  # one per resubmit
    assert store.get("pylost:input:%s:0" % r.id) == x.tobytes()


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


def test_a_run_rejected_when_resubmitted_after_its_job_ended_returns_the_result(fleet):
    """A run's first SUBMIT goes unanswered past request_timeout_ms, so the client reads Redis
    (nothing yet) and sends the same id again; the job ends just before the broker reads that
    second SUBMIT (its record is in Redis, its notice not read yet), so the broker, no longer
    holding the id, judges it as a new job and rejects it (queue_full). The run returns the
    job's result, read from Redis once after the rejection. (Before, it raised QueueFull while
    the result was there: the caller retried with a new id, the finished job thrown away.)"""
    store = fleet.redis()
    y = np.array([5.0, 6.0], np.float32)
    x = np.arange(8, dtype=np.float32)

    def on_submit(n, body, reply, serve):
        if n == 2:
            job_id = body["jobs"][0]["id"]
            store.set("pyended:result:" + job_id, done_record(y, "tiny", "stub"))
            reply(b"ACCEPTED", {"rid": body["rid"], "ids": [], "rejected": [
                {"id": job_id, "code": "queue_full", "message": "full"}]})
        # the first: silence
    r, seen, _ = _run_against_a_stub_broker(fleet, "pyended:", x, y, on_submit)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert r.status == "done" and len(seen) == 2


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


@contextlib.contextmanager
def swallowing_broker():
    """A stub broker that reads every message and answers none but LIMITS (else a client sends
    nothing more): yields (its frontend, what else it got)."""
    got = []
    with stub_broker(lambda router, message: got.append(message)) as frontend:
        yield frontend, got


def test_close_ends_the_calls_other_threads_wait_in():
    """Client.close() while other threads wait for the broker's answer (submit, submit_many,
    stats) or a result (run): each raises Unavailable at once, none waits for
    request_timeout_ms (20 s here). AsyncClient.close() ends an awaited submit the same way."""
    x = np.ones(8, np.float32)
    with swallowing_broker() as (frontend, got):
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


def test_nothing_goes_out_before_limits_is_answered_and_an_error_falls_back():
    """The first request on a connection is LIMITS, and a STATS asked meanwhile waits for its
    answer; a broker from before LIMITS answers ERROR unknown_command: the client keeps to its
    configured max_message_bytes (and 10,000 jobs a SUBMIT) and goes on."""
    import msgpack
    got, early = [], []

    def answer(router, peer, tag, command, body):
        rid = msgpack.unpackb(body)["rid"]
        if command == b"LIMITS":
            # Anything the client sends before this answer is caught here (but LIMITS again:
            # the client resends it every 0.5 s while it is unanswered).
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                if router.poll(10):
                    message = router.recv_multipart()
                    if message[2] != b"LIMITS":
                        early.append(message)
            router.send_multipart([peer, tag, b"ERROR", msgpack.packb(
                {"code": "unknown_command", "message": 'unknown command "LIMITS"', "rid": rid})])
            for message in early:
                answer(router, *message)
        else:
            router.send_multipart([peer, tag, command, msgpack.packb({"rid": rid})])

    def handle(router, message):
        got.append(message[2])
        answer(router, *message)
    with stub_broker(handle, limits=False) as frontend:
        with ferry.Client(frontend, "redis://127.0.0.1:9", push_results=False,
                          max_message_bytes=1 << 20) as c:
            assert c.stats() == {}
            engine = c._aio._engine
            assert engine._limits == (1 << 20, 10000, 0)
    assert got == [b"LIMITS", b"STATS"] and early == []


def test_a_limits_left_unanswered_is_sent_again():
    """A LIMITS lost on the way (libzmq takes one sent as the connection drops into the dead
    connection's pipe) goes out again, with the same rid, while a request waits behind it: the
    request is answered, not held for ever."""
    import msgpack
    got = []

    def handle(router, frames):
        got.append((frames[2], msgpack.unpackb(frames[3])["rid"]))
        if frames[2] == b"LIMITS" and len(got) == 1:
            return  # the first one is lost
        if not answered_limits(router, frames):
            router.send_multipart(frames)  # an echo: STATS {"rid"}
    with stub_broker(handle, limits=False) as frontend:
        with ferry.Client(frontend, "redis://127.0.0.1:9", push_results=False,
                          request_timeout_ms=5000) as c:
            assert c.stats() == {}
    assert [command for command, _ in got] == [b"LIMITS", b"LIMITS", b"STATS"]
    assert got[0][1] == got[1][1]


def test_a_submit_never_sent_deletes_its_stored_inputs(fleet):
    """No broker took the SUBMIT (none listens there): at the timeout its jobs' stored inputs
    are deleted, as run's are; they would otherwise stay for input_ttl_s -- for ids the client
    made. A caller's id may be a pending job's (a retry of it): its keys are then that job's
    inputs, and are left to expire."""
    from fleet import free_port
    x = np.arange(40000, dtype=np.float32)  # stored
    prefix = "pyunsent-%s:" % uuid.uuid4().hex[:8]
    r = fleet.redis()
    with ferry.Client("tcp://127.0.0.1:%d" % free_port(), fleet.redis_url, redis_prefix=prefix,
                      request_timeout_ms=300, push_results=False) as c:
        with pytest.raises(ferry.Unavailable):
            c.submit("null", x)
        with pytest.raises(ferry.Unavailable):
            c.submit_many([ferry.Job("null", x), ferry.Job("null", x)])
        with pytest.raises(ferry.Unavailable):
            c.run("null", x, timeout=0.3)
        c.poll(uid("flush"))  # after the DELs, on the same connection
        assert r.keys(prefix + "*") == []
        given = uid("unsent")
        with pytest.raises(ferry.Unavailable):
            c.submit("null", x, id=given)
        with pytest.raises(ferry.Unavailable):
            c.run("null", x, id=given, timeout=0.3)
        c.poll(uid("flush"))
        assert r.keys(prefix + "*") == [(prefix + "input:%s:0" % given).encode()]


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


def _accepting(router, message, swallow_after=None, seen=None):
    """For a stub broker: answers a SUBMIT ACCEPTED (every job), or none past `swallow_after`
    SUBMITs (counted in `seen`)."""
    import msgpack
    peer, tag, command, body, *_ = message
    if command != b"SUBMIT":
        return
    body = msgpack.unpackb(body)
    if seen is not None:
        seen.append(body)
        if swallow_after is not None and len(seen) > swallow_after:
            return
    ids = [j["id"] for j in body["jobs"]]
    router.send_multipart([peer, tag, b"ACCEPTED",
                           msgpack.packb({"ids": ids, "rejected": [], "rid": body["rid"]})])


def test_a_short_wait_on_a_job_of_ours_reads_redis_before_it_times_out(fleet):
    """A wait shorter than the first re-check (50 ms) on a job this client submitted still reads
    Redis once, at its deadline: the job's notice may have been lost (a broker that restarted
    sent FINISHED on a dead connection). Before, every such wait timed out unread."""
    prefix = "pyshort-%s:" % uuid.uuid4().hex[:8]
    with stub_broker(_accepting) as frontend:
        with ferry.Client(frontend, fleet.redis_url, redis_prefix=prefix,
                          push_results=False) as c:
            x = np.ones(8, np.float32)
            id = c.submit("tiny", x)
            with pytest.raises(ferry.Timeout):
                c.wait(id, timeout=0.02)
            fleet.redis().set(prefix + "result:" + id, done_record(x, "tiny", "stub"))
            r = c.wait(id, timeout=0.02)
            assert r.status == "done" and r.worker == "stub"


def test_submit_many_split_in_two_keeps_the_verdicts_of_the_part_answered(fleet):
    """submit_many split into two SUBMITs (the broker takes one job a message) whose second gets
    no answer: the Unavailable it raises lists the first job as accepted (it is: wait for it),
    and only the second as unanswered. Before, it said none was accepted, and a caller that
    resubmitted them all got Duplicate for the first."""
    seen = []

    def handle(router, message):
        if not answered_limits(router, message, max_jobs_per_message=1):
            _accepting(router, message, swallow_after=1, seen=seen)
    x = np.ones(8, np.float32)
    with stub_broker(handle, limits=False) as frontend:
        with ferry.Client(frontend, fleet.redis_url, push_results=False,
                          request_timeout_ms=500) as c:
            with pytest.raises(ferry.Unavailable) as e:
                c.submit_many([ferry.Job("tiny", x, id="py-split-a"),
                               ferry.Job("tiny", x, id="py-split-b")])
    assert [[j["id"] for j in b["jobs"]] for b in seen] == [["py-split-a"], ["py-split-b"]]
    assert e.value.ids == ["py-split-a", "py-split-b"]
    assert e.value.accepted == ["py-split-a"]
    assert list(e.value.errors) == ["py-split-b"]
    assert e.value.id == "py-split-b"


def test_cancel_is_split_under_the_brokers_limits(models_dir):
    """cancel() keeps to the broker's LIMITS: 2,000 ids of 104 characters (~210 KB) against a
    broker that takes 100 ids and 64 KiB a message. Before, the client split at 10,000 ids: the
    broker refused the CANCEL whole (TooLarge), or dropped the connection on the frame over its
    limit (Unavailable after the request timeout)."""
    from fleet import Fleet
    f = Fleet(models_dir, workers=0,
              broker_args=["--max-message-bytes", "65536", "--max-jobs-per-message", "100"])
    try:
        ids = []
        for i in range(2000):
            head = "py-cancel-%d-" % i
            ids.append(head + "x" * (104 - len(head)))
        with ferry.Client(f.frontend, f.redis_url, request_timeout_ms=20000) as c:
            report = c.cancel(*ids)  # split before the limits are known, then again under them
            assert report.not_found == ids and report.cancelled == [] and report.running == []
            assert c.cancel(*ids).not_found == ids  # with the limits known
    finally:
        f.stop()


def test_inputs_stored_before_redis_refused_the_rest_are_deleted(models_dir):
    """Redis takes the first of a job's big inputs and refuses the next (here: over its
    proto-max-bulk-len): the submit fails before anything is sent, and the input Redis did take
    is deleted again (nobody would read it; before, it stayed for input_ttl_s)."""
    from fleet import Fleet
    f = Fleet(models_dir, workers=0)
    try:
        r = f.redis()
        r.config_set("proto-max-bulk-len", "2mb")
        r.config_resetstat()
        with ferry.Client(f.frontend, f.redis_url, push_results=False) as c:
            with pytest.raises(ferry.FerryError):
                c.submit("null", np.zeros(1 << 18, np.float32), np.zeros(1 << 20, np.float32))
            assert r.info("commandstats")["cmdstat_set"]["calls"] == 1  # the first was stored
            wait_for(lambda: not r.keys("ferry:input:*"), 10, "the stored input deleted")
    finally:
        f.stop()


def test_a_run_sent_again_and_again_keeps_one_reply_handler(fleet):
    """A stub broker never answers (a run's SUBMIT is ack:false: silence is acceptance), so the
    run sends its job again every request_timeout_ms. Each SUBMIT's reply handler waits for a
    rejection; once the job went out again, only its latest SUBMIT's counts, so a sweep drops
    the others: a long run keeps one handler, not one per resend (before, every one stayed, with
    its jobs' inputs, until the run returned)."""
    submits = []

    def handle(router, message):
        if message[2] == b"SUBMIT":
            submits.append(message[3])

    async def main():
        with stub_broker(handle) as frontend:
            c = ferry.AsyncClient(frontend, fleet.redis_url, redis_prefix=uid("resend") + ":",
                                  request_timeout_ms=50)
            run = asyncio.ensure_future(c.run("tiny", np.zeros(8, np.float32), timeout=30))
            for _ in range(2000):
                if len(submits) >= 6 or run.done():
                    break
                await asyncio.sleep(0.01)
            engine = c._engine
            engine._sweep(engine.loop.time())
            assert len(submits) >= 6
            assert len(engine._awaiting) == 1, engine._awaiting
            run.cancel()
            await c.close()
    asyncio.run(main())


def test_every_job_a_broker_error_ends_names_its_own_id(fleet):
    """A broker that answers SUBMIT with ERROR (every job of it fails): submit's error has the
    job's id (to resubmit a retryable one with), and each job of a submit_many its own error
    with its own id. Before, they shared one error whose .id was None."""
    import msgpack

    def handle(router, message):
        peer, tag, command, body, *_ = message
        if command == b"SUBMIT":
            rid = msgpack.unpackb(body)["rid"]
            router.send_multipart([peer, tag, b"ERROR", msgpack.packb(
                {"code": "unavailable", "message": "journal down", "rid": rid})])

    with stub_broker(handle) as frontend:
        with ferry.Client(frontend, fleet.redis_url) as c:
            with pytest.raises(ferry.Unavailable) as e:
                c.submit("tiny", np.zeros(8, np.float32), id="one-job")
            assert e.value.id == "one-job"
            assert "journal down" in str(e.value)
            jobs = [ferry.Job("tiny", np.zeros(8, np.float32), id="job-%d" % k)
                    for k in range(3)]
            with pytest.raises(ferry.Unavailable) as e:
                c.submit_many(jobs)
            assert e.value.id == "job-0"
            assert sorted(e.value.errors) == ["job-0", "job-1", "job-2"]
            for id, err in e.value.errors.items():
                assert isinstance(err, ferry.Unavailable) and err.id == id


def test_close_while_subscribing_closes_the_subscription_connection():
    """close() while the result subscription waits on a Redis that does not answer SUBSCRIBE:
    its connection closes too (before, the cancelled subscribe left it open for as long as the
    event loop ran)."""
    import socket
    silent = socket.socket()  # a Redis that accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent.settimeout(10)
    accepted = []

    def handle(router, message):
        pass  # nothing accepted: the submit waits

    async def main():
        with stub_broker(handle) as frontend:
            c = ferry.AsyncClient(frontend, "redis://127.0.0.1:%d" % silent.getsockname()[1])
            submit = asyncio.ensure_future(c.submit("tiny", np.zeros(8, np.float32)))
            conn, _ = await asyncio.get_running_loop().run_in_executor(None, silent.accept)
            accepted.append(conn)
            conn.settimeout(0.05)
            data = b""
            for _ in range(1000):  # until it is subscribing
                if b"SUBSCRIBE" in data:
                    break
                with contextlib.suppress(socket.timeout):
                    data += conn.recv(4096)
                await asyncio.sleep(0.01)
            assert b"SUBSCRIBE" in data, data
            await c.close()
            with pytest.raises(ferry.Unavailable):
                await submit
            conn.settimeout(0)
            for _ in range(200):  # its end comes while the loop runs on, or never
                with contextlib.suppress(BlockingIOError):
                    if conn.recv(4096) == b"":
                        return
                await asyncio.sleep(0.01)
            pytest.fail("the subscription's connection is still open after close()")
    try:
        asyncio.run(main())
    finally:
        for s in accepted + [silent]:
            s.close()
