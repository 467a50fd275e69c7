"""The clients when Redis misbehaves: a consuming read cut off or its delete held, a slow link, an
error reply, a user that may only GETDEL, a stalled server (each wait ends at its own timeout,
the connection closes, no resubmit goes out past a run's timeout, nor does the storing of its
input), and the keepalive of the result subscription."""

import asyncio
import threading
import time
import uuid

import numpy as np
import pytest

import ferry
from conftest import done_record, spy_submits, stub_broker, uid
from fleet import wait_for


def _store_result(r, key, y):
    """Writes a done result record with output `y` under `key`, as a worker does."""
    r.set(key, done_record(y, "m", "w"))


def test_a_consuming_read_cut_off_keeps_the_result(fleet):
    """consume_results: a read cut off halfway through its reply (the connection closes, as
    Redis does to a client over its output buffer limit; here a proxy in front of Redis does
    it, which any server lets it) deletes nothing: the next wait gets the result, and only then
    is it deleted. (With GETDEL as the read, Redis deleted the record before the reply was
    lost, and it was gone for good.)"""
    from redis_proxy import RedisProxy
    r = fleet.redis()
    i = uid("cut")
    key = ("ferry:result:" + i).encode()
    y = np.arange(262144, dtype=np.float32)  # 1 MiB
    _store_result(r, key, y)
    cutting = True
    proxy = RedisProxy(fleet.redis_port, cut=lambda argv: cutting and key in argv[1:2])
    try:
        with ferry.Client(fleet.frontend, "redis://127.0.0.1:%d" % proxy.port,
                          consume_results=True, push_results=False) as c:
            with pytest.raises(ferry.Unavailable):
                c.wait(i, timeout=0)  # one read
            assert proxy.cut_off and r.exists(key) == 1
            cutting = False
            got = c.wait(i, timeout=30)
            np.testing.assert_array_equal(got.outputs[0], y)
            assert r.exists(key) == 0, "the read that got it did not delete it"
    finally:
        proxy.close()


def test_a_consuming_wait_returns_what_it_read_without_waiting_for_its_delete(fleet):
    """consume_results: a wait that read a result whole returns it at once, its DEL sent behind
    it and not awaited. Here Redis holds writes for 3 s (CLIENT PAUSE WRITE: the GET goes
    through, the DEL waits): the wait returns within its caller's 0.5 s bound all the same.
    Before, it sat on the DEL, and a caller that gave up meanwhile (asyncio.wait_for) lost the
    result, deleted once Redis wrote again. The key goes once Redis writes again; and a client
    closed while such a DEL is unanswered waits for it (within close's 1 s)."""
    r = fleet.redis()
    ids = [uid("paused") for _ in range(2)]
    y = np.arange(8, dtype=np.float32)
    for i in ids:
        _store_result(r, "ferry:result:" + i, y)

    async def main():
        async with ferry.AsyncClient(fleet.frontend, fleet.redis_url,
                                     consume_results=True) as c:
            assert await c.poll(uid("connect")) is None  # connected to Redis
            r.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
            got = await asyncio.wait_for(c.wait(ids[0], timeout=30), 0.5)
            np.testing.assert_array_equal(got.outputs[0], y)
            deadline = time.monotonic() + 20
            while r.exists("ferry:result:" + ids[0]) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert r.exists("ferry:result:" + ids[0]) == 0, "the consumed result is still there"
            r.execute_command("CLIENT", "PAUSE", "100", "WRITE")
            got = await c.wait(ids[1], timeout=30)
            np.testing.assert_array_equal(got.outputs[0], y)
        assert r.exists("ferry:result:" + ids[1]) == 0, "closed without its DEL answered"
    try:
        asyncio.run(main())
    finally:
        r.execute_command("CLIENT", "UNPAUSE")


def test_big_inputs_slow_to_store_do_not_time_out_while_they_move(fleet):
    """Redis behind a link that takes commands at 4 MB/s: storing the inputs of 12 jobs of 1 MiB
    takes about 3 s, three times the client's request timeout. The connection moves bytes all
    along, so none of its commands is late (the timeout bounds silence, as the C++ SDK's socket
    timeouts do, not a whole transfer) and the jobs run. Before, the pipeline of SETs failed
    Unavailable after 1 s, on every retry."""
    from redis_proxy import RedisProxy
    proxy = RedisProxy(fleet.redis_port, rate=4 << 20)
    xs = [np.full(1 << 18, i, dtype=np.float32) for i in range(12)]  # 1 MiB each: stored
    try:
        with ferry.Client(fleet.frontend, "redis://127.0.0.1:%d" % proxy.port,
                          request_timeout_ms=1000) as c:
            started = time.monotonic()
            ids = c.submit_many([ferry.Job("null", x) for x in xs])
            assert time.monotonic() - started > 1.0, "not slowed: the test shows nothing"
            for i, x in zip(ids, xs):
                np.testing.assert_array_equal(c.wait(i, timeout=60).outputs[0], x)
    finally:
        proxy.close()


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


def test_the_result_subscription_has_tcp_keepalive_and_commands_have_none(fleet):
    # A subscriber only reads: without keepalive probes a Redis gone without a FIN/RST would
    # leave it waiting for good (its notices lost). As the C++ SDK: 15 s idle, 5 s, 3 probes.
    import socket
    from ferry import _resp

    async def main():
        loop = asyncio.get_running_loop()
        endpoint = _resp.parse_redis_url(fleet.redis_url)
        sub = await _resp.Connection.open(endpoint, loop, 5.0, on_push=lambda payload: None,
                                          select_db=False)
        plain = await _resp.Connection.open(endpoint, loop, 5.0)
        try:
            s = sub._transport.get_extra_info("socket")
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            p = plain._transport.get_extra_info("socket")
            assert p.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
            assert await plain.call("PING") == "PONG"
        finally:
            sub.close()
            plain.close()

    asyncio.run(main())


def test_keepalive_is_set_where_the_platform_names_its_options_otherwise(monkeypatch):
    # macOS has no TCP_KEEPIDLE (its idle option is TCP_KEEPALIVE): the subscription still
    # opens, with the options the platform has.
    import socket
    from ferry import _resp
    monkeypatch.delattr(socket, "TCP_KEEPIDLE")
    with socket.socket() as s:
        _resp._keepalive(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


def test_a_wait_on_a_stalled_redis_ends_at_its_own_timeout(models_dir):
    # Redis stopped (SIGSTOP): a GET that gets no reply. A wait with 0.5 s gives up at its own
    # deadline, with Timeout, not after the client's request timeout (30 s here), as the C++
    # SDK's Wait does: each read is bounded by what is left of the wait. Giving up does not
    # close the connection the client's other commands share: a poll waiting beside it (with
    # the whole request timeout) gets its answer once Redis goes on.
    import signal
    from fleet import Fleet
    f = Fleet(models_dir, workers=0)

    async def main():
        async with ferry.AsyncClient(f.frontend, f.redis_url, request_timeout_ms=30000) as c:
            assert await c.poll(uid("stall")) is None  # connected to Redis
            f.redis_proc.send_signal(signal.SIGSTOP)
            try:
                beside = asyncio.ensure_future(c.poll(uid("beside")))
                started = time.monotonic()
                with pytest.raises(ferry.Timeout):
                    await c.wait(uid("stall"), timeout=0.5)
                assert time.monotonic() - started < 15, "held for the request timeout"
                assert not beside.done()
            finally:
                f.redis_proc.send_signal(signal.SIGCONT)
            assert await asyncio.wait_for(beside, 20) is None
            assert await c.poll(uid("stall")) is None
    try:
        asyncio.run(main())
    finally:
        f.stop()


def test_a_stalled_redis_closes_the_connection_also_after_its_callers_left(models_dir):
    # Each command's reply is watched for the connection's timeout (0.5 s here), whether its
    # caller still waits or not: a caller cancelled (an unbounded command), one that gave up at
    # its own bound, and a pipeline's cancelled caller each leave a stalled Redis to be found,
    # and their connection closed, so that no later command waits behind it.
    import signal
    from ferry import _resp
    from fleet import Fleet
    f = Fleet(models_dir, workers=0)

    async def leave(cmds, how):
        if how == "bounded":
            with pytest.raises(ferry.Unavailable):
                await cmds.execute("GET", "k", timeout=0.1)
            return
        call = cmds.execute("GET", "k") if how == "cancelled" else \
            cmds.execute_many([("GET", "k"), ("GET", "j")])
        task = asyncio.ensure_future(call)
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def main():
        loop = asyncio.get_running_loop()
        for how in ("cancelled", "bounded", "pipeline cancelled"):
            cmds = _resp.Commands(_resp.parse_redis_url(f.redis_url), loop, 0.5)
            assert await cmds.execute("PING") == "PONG"
            f.redis_proc.send_signal(signal.SIGSTOP)
            try:
                await leave(cmds, how)
                await asyncio.sleep(1.0)
                assert not cmds.connected(), how + ": the stalled connection is still open"
            finally:
                f.redis_proc.send_signal(signal.SIGCONT)
                cmds.close()
    try:
        asyncio.run(main())
    finally:
        f.stop()


def test_a_stalled_redis_is_found_though_later_commands_keep_going_out(models_dir):
    # Redis stopped: a command waits for its reply while later ones keep going out (waiters
    # re-checking, new calls), their bytes taken by the kernel's buffers. The first command
    # still fails within about the connection's timeout (0.5 s here): only its own bytes and
    # those before it count as the connection moving. (Before, the later commands' bytes kept
    # it open for as long as they came.)
    import signal
    from ferry import _resp
    from fleet import Fleet
    f = Fleet(models_dir, workers=0)

    async def main():
        loop = asyncio.get_running_loop()
        cmds = _resp.Commands(_resp.parse_redis_url(f.redis_url), loop, 0.5)
        assert await cmds.execute("PING") == "PONG"
        f.redis_proc.send_signal(signal.SIGSTOP)
        later = []
        try:
            first = asyncio.ensure_future(cmds.execute("GET", "k"))
            deadline = loop.time() + 15
            while not first.done() and loop.time() < deadline:
                later.append(asyncio.ensure_future(cmds.execute("GET", "j")))
                await asyncio.sleep(0.05)
            assert first.done(), "the stalled connection stayed open"
            with pytest.raises(ferry.Unavailable):
                await first
        finally:
            f.redis_proc.send_signal(signal.SIGCONT)
            cmds.close()
            await asyncio.gather(*later, return_exceptions=True)
    try:
        asyncio.run(main())
    finally:
        f.stop()


def test_waits_that_gave_up_on_a_stalled_redis_leave_no_error_unread(models_dir):
    # Waits that gave up at their own deadline leave their GETs on the connection; when the
    # connection's timeout closes it, those GETs fail with nobody awaiting them: their errors
    # are taken, not logged by asyncio ("Future exception was never retrieved"). The client goes
    # on over a new connection once Redis does.
    import gc
    import signal
    from fleet import Fleet
    f = Fleet(models_dir, workers=0)
    unread = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unread.append(ctx))
        async with ferry.AsyncClient(f.frontend, f.redis_url, request_timeout_ms=1000) as c:
            assert await c.poll(uid("stall")) is None  # connected to Redis
            f.redis_proc.send_signal(signal.SIGSTOP)
            try:
                for _ in range(3):
                    with pytest.raises(ferry.Timeout):
                        await c.wait(uid("stall"), timeout=0.2)
                # The connection's timer closes it a request timeout after the first GET.
                await asyncio.sleep(1.5)
                gc.collect()
                await asyncio.sleep(0)
            finally:
                f.redis_proc.send_signal(signal.SIGCONT)
            assert await c.poll(uid("stall")) is None
        gc.collect()
    try:
        asyncio.run(main())
    finally:
        f.stop()
    assert not [ctx for ctx in unread if "never retrieved" in ctx.get("message", "")], unread


def test_a_run_on_a_stalled_redis_sends_no_resubmit_past_its_timeout(models_dir):
    # A stub broker that never answers, and Redis stopped before the first silence's read: that
    # read is cut off at the run's deadline, and the run ends there with Timeout. Before, the
    # cut-off read counted as no error, so the silence's resubmit went out past the deadline
    # and wrote the stored input to the stalled Redis, holding the run for up to a request
    # timeout more. The engine calls a resubmit makes are recorded with their times.
    import signal
    from fleet import Fleet
    x = np.arange(50000, dtype=np.float32)  # stored in Redis
    calls = []

    async def main(frontend):
        # input_ttl_s 1: the client of before wrote the input again at such a resubmit.
        async with ferry.AsyncClient(frontend, f.redis_url,
                                     request_timeout_ms=3000, input_ttl_s=1) as c:
            loop = asyncio.get_running_loop()
            engine = c._get_engine()
            for owner, name in ((engine.inputs, "store"), (engine.inputs, "refresh"),
                                (engine, "queue_run")):
                def spy(*args, _name=name, _real=getattr(owner, name)):
                    calls.append((_name, loop.time()))
                    return _real(*args)
                setattr(owner, name, spy)
            loop.call_later(2.0, f.redis_proc.send_signal, signal.SIGSTOP)
            deadline = loop.time() + 3.5
            with pytest.raises(ferry.Timeout):
                await c.run("tiny", x, timeout=3.5)
            return deadline
    f = Fleet(models_dir, workers=0)
    try:
        with stub_broker(lambda router, message: None) as frontend:  # never answers
            deadline = asyncio.run(main(frontend))
    finally:
        f.redis_proc.send_signal(signal.SIGCONT)
        f.stop()
    assert [name for name, _ in calls[:2]] == ["store", "queue_run"], calls  # the first
    late = [(name, at - deadline) for name, at in calls if at >= deadline]
    assert not late, "resubmitted past the run's deadline: %s" % late


def test_a_runs_timeout_bounds_storing_its_input_in_a_stalled_redis(models_dir):
    # Redis stopped (SIGSTOP) before a run whose input is stored in Redis: the SET of the input
    # gets no reply, and the run gives up at its own timeout (0.5 s), not after the client's
    # request timeout (30 s here), as the C++ SDK's Run does. Nothing was sent to the broker.
    import signal
    from fleet import Fleet
    x = np.arange(50000, dtype=np.float32)  # 200 KB: stored in Redis
    f = Fleet(models_dir, workers=0)

    async def main():
        async with ferry.AsyncClient(f.frontend, f.redis_url, request_timeout_ms=30000) as c:
            assert await c.poll(uid("stall")) is None  # connected to Redis
            sent = spy_submits(c._get_engine())
            f.redis_proc.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(ferry.Unavailable):
                    await c.run("tiny", x, timeout=0.5)
                assert time.monotonic() - started < 15, "held for the request timeout"
            finally:
                f.redis_proc.send_signal(signal.SIGCONT)
            assert sent == []
    try:
        asyncio.run(main())
    finally:
        f.stop()
