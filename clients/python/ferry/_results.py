"""Results: which jobs are finished, their inline records, and the callers waiting for them.

One `Results` per client, on the client's asyncio loop, beside the Engine (the broker's socket,
_engine.py). An entry per id says what is known: ours (submitted here, so a notice will come),
finished (a notice said its result is in Redis), the record when it came inline. Notices arrive
two ways: ``FINISHED`` from the broker (the Engine calls `finished`) and, at light load, messages
the worker publishes on this client's Redis channel (``notify``; the subscription lives here).
A notice marks the entry and wakes its waiters; a waiter decodes the inline record or reads the
result from Redis (GET, pipelined with the other reads of the same turn). Waiters also re-check
Redis on their own every 50 ms doubling to 1 s: the safety net for lost notices (a broker
restart) and for ids another process submitted.

Nothing here is thread-safe: every method runs on the loop.
"""

import asyncio
import uuid

import msgpack

from . import _protocol, _resp
from ._errors import FerryError, Timeout, Unavailable
from ._wheel import TimerWheel

PUSH_MAX_TRACKED = 64           # notices straight from workers while fewer jobs are tracked
FIRST_RECHECK = 0.05            # s: first Redis re-check of a waiter, doubling ...
MAX_RECHECK = 1.0               # ... to this
MAX_HELD_BYTES = 64 << 20       # inline records kept for ids nobody waits on yet
TRACK_TTL = 60.0                # s: entries nobody waits on are dropped after this
MAX_TRACKED = 65536             # jobs tracked (as the C++ SDK's): a wait for others reads first
MAX_TO_CONSUME = 100000         # result keys queued for deletion (beyond: they expire)
PUSH_RETRY_MIN, PUSH_RETRY_MAX = 1.0, 30.0
# Error replies a read waits out as Unavailable (as the C++ SDK): ones that go away by themselves
# (protocol/redis_errors.h), and a missing or wrong password (the C++ SDK's connect says those).
# Any other (NOPERM: an ACL user that may not read results, ...) fails the read at once:
# internal.
RETRIED_REPLY_ERRORS = ("LOADING", "BUSY", "READONLY", "OOM", "MASTERDOWN", "TRYAGAIN",
                        "CLUSTERDOWN", "NOREPLICAS", "MISCONF", "NOAUTH", "WRONGPASS")


class _Entry:
    """What the client knows about one id: ours (submitted here: a notice will come), finished
    (a notice said the result is in Redis), the inline record, waiters to wake."""

    __slots__ = ("ours", "has_result", "record", "recheck", "version", "waiters", "nwait",
                 "delivered", "touched", "consumed")

    def __init__(self, now):
        self.ours = False
        self.has_result = False
        self.record = None
        self.recheck = False
        self.version = 0
        self.waiters = []
        self.nwait = 0
        self.delivered = False
        self.touched = now
        self.consumed = False   # queued for deletion here: Redis may no longer hold it


def _wake_waiters(e):
    if e.waiters:
        ws, e.waiters = e.waiters, []
        for f in ws:
            if not f.done():
                f.set_result(None)


class Results:
    """The result side of one client. `redis` is the client's command connection (shared with
    the Engine's input writes); `handshake_error()` says why the broker's handshake fails (None
    when it does not); `on_error(exception, counted=True)` records an error a callback hit."""

    def __init__(self, options, loop, redis, endpoint, timeout, handshake_error, on_error):
        self.opts = options
        self.loop = loop
        self.redis = redis
        self.endpoint = endpoint
        self.prefix = options.redis_prefix
        self.timeout = timeout
        self._handshake_error = handshake_error
        self._on_error = on_error
        self.closed = False
        self.entries = {}
        self.held_bytes = 0
        self._to_consume = []    # result keys to delete: consumed results that came inline
        self._deleting = set()   # DELs of results consuming waits read, not answered yet
        self._del_refused = False  # Redis answered NOPERM to DEL on results: GETDEL instead
        self._consumer = None    # the task that deletes them
        self._wheel = TimerWheel(loop)  # waiters' timers
        # The result subscription.
        self._sub = None
        self._channel = None
        self._subscribing = None
        self._sub_retry_at = 0.0
        self._sub_backoff = 0.0
        self._subscribed_before = False

    def sweep(self, now):
        """Drops the entries nobody waits on that nothing touched for TRACK_TTL."""
        stale = [i for i, e in self.entries.items() if e.nwait == 0 and now - e.touched > TRACK_TTL]
        for i in stale:
            self._erase(i)

    def wake(self, id):
        """Wakes id's waiters without a change (a run's rejection: they raise it)."""
        e = self.entries.get(id)
        if e is not None:
            _wake_waiters(e)

    def close(self):
        """Waits in progress raise Unavailable; the subscription closes."""
        self.closed = True
        self._wheel.close()
        if self._subscribing is not None:
            self._subscribing.cancel()
        for e in list(self.entries.values()):
            self._changed(e)
        if self._sub is not None:
            self._sub._on_lost = None
            self._sub.close()

    # ---- entries -----------------------------------------------------------------------------

    def _erase(self, id):
        e = self.entries.pop(id, None)
        if e is not None and e.record is not None:
            self.held_bytes -= len(e.record)

    def _changed(self, e):
        e.version += 1
        e.touched = self.loop.time()
        _wake_waiters(e)

    def finished(self, ids, records):
        """A FINISHED body (or a worker's notice): these ids' results are in Redis.

        A second notice for an id that has a result but no record is not ignored: a worker
        whose write Redis refused at first may have published its notice before the record was
        stored (protocol.md, notices), so a waiter may have read nothing since. It reads again
        now, not at its next re-check."""
        entries = self.entries
        if records:
            for id, rec in records.items():
                e = entries.get(id)
                if e is None or e.record is not None or type(rec) is not bytes:
                    continue
                if e.nwait == 0 and self.held_bytes + len(rec) > MAX_HELD_BYTES:
                    continue  # read from Redis when someone waits
                e.record = rec
                self.held_bytes += len(rec)
                e.has_result = True
                self._changed(e)
        for id in ids:
            e = entries.get(id)
            if e is None or (e.has_result and (e.record is not None or e.nwait == 0)):
                continue
            e.has_result = True
            self._changed(e)

    def _recheck_ours(self):
        for e in list(self.entries.values()):
            if e.ours and not e.has_result:
                e.recheck = True
                self._changed(e)

    def track(self, ids):
        now = self.loop.time()
        entries = self.entries
        for id in ids:
            e = entries.get(id)
            if e is None:
                if len(entries) >= MAX_TRACKED:  # bounded memory, and a short sweep()
                    break
                e = entries[id] = _Entry(now)
            e.ours = True
            e.touched = now

    def untrack(self, ids):
        for id in ids:
            e = self.entries.get(id)
            if e is None or e.has_result:
                continue
            e.ours = False
            if e.nwait == 0:
                self._erase(id)

    def finished_here(self, id):
        e = self.entries.get(id)
        return e is not None and e.has_result

    async def _read_raw(self, id, timeout=None):
        """The result record of `id` in Redis (bytes or bytearray), or None. Unavailable when
        Redis does not answer (or is loading, busy, wants a password: RETRIED_REPLY_ERRORS) --
        within `timeout` seconds when that is less than the client's --, FerryError(internal)
        when it answers with another error (NOPERM: the ACL user may not read results): waiting
        would not change that. Never deletes: a consuming wait deletes what it read only once it
        came whole, so a read cut off loses nothing."""
        key = self.prefix + "result:" + id
        command = "GET"
        try:
            return await self.redis.execute(command, key, timeout=timeout)
        except _resp.ReplyError as e:
            if str(e).startswith(RETRIED_REPLY_ERRORS):
                raise Unavailable("Redis %s %s: %s" % (command, key, e), id=id)
            raise FerryError("Redis refused %s %s: %s" % (command, key, e), code="internal",
                             id=id)

    async def read(self, id):
        """The result of `id` in Redis, or None (see _read_raw for the errors)."""
        raw = await self._read_raw(id)
        if raw is None:
            return None
        return _protocol.decode_result(raw, id)

    def _consume_later(self, id):
        """Deletes id's result (it came inline) in the background, batched with the others of
        this loop turn (delete_results). At most MAX_TO_CONSUME wait (as the C++ SDK's
        ResultDeleter): beyond, they expire."""
        if len(self._to_consume) >= MAX_TO_CONSUME:
            return
        self._to_consume.append(self.prefix + "result:" + id)
        if self._consumer is None or self._consumer.done():
            self._consumer = self.loop.create_task(self._consume_pending())

    async def _consume_pending(self):
        while self._to_consume and not self.closed:
            keys, self._to_consume = self._to_consume[:1024], self._to_consume[1024:]
            try:
                await self.delete_results(keys)
            except Exception:  # best effort: they expire with their result_ttl_s
                pass

    def _delete_read(self, id):
        """Deletes id's result, which a consuming wait read whole: the DEL goes on the connection
        now, ahead of any later command of this client (a poll after the wait finds nothing),
        and is not awaited, so the wait returns at once with what it read -- a DEL held by Redis
        neither outlasts the wait's timeout nor, should its caller be cancelled meanwhile, takes
        a result nobody got. NOPERM, or no connection: the background deleter takes it. Best
        effort: a DEL lost with its connection leaves the result to its result_ttl_s."""
        key = self.prefix + "result:" + id
        fut = None if self._del_refused else self.redis.send("DEL", key)
        if fut is None:
            self._consume_later(id)
            return
        self._deleting.add(fut)

        def answered(f):
            self._deleting.discard(f)
            if not f.cancelled() and f.exception() is None and \
                    isinstance(f.result(), _resp.ReplyError) and \
                    str(f.result()).startswith("NOPERM"):
                self._del_refused = True
                self._consume_later(id)
        fut.add_done_callback(answered)

    async def delete_results(self, keys):
        """DEL of the result keys `keys`; once Redis said NOPERM to DEL, GETDELs instead, 16 a
        round trip (each brings its value back)."""
        if not self._del_refused:
            try:
                await self.redis.execute("DEL", *keys)
                return
            except _resp.ReplyError as e:
                if not str(e).startswith("NOPERM"):
                    raise
                self._del_refused = True
        for k in range(0, len(keys), 16):
            await self.redis.execute_many([("GETDEL", key) for key in keys[k:k + 16]])

    def deletes_due(self):
        """Whether consumed results wait for their deletion (for close)."""
        return bool(self._to_consume or self._deleting)

    async def finish_deletes(self):
        """close's last round trip: the result keys still waiting for deletion (at most 1,024)
        deleted, and the DELs consuming waits sent answered."""
        keys, self._to_consume = self._to_consume[:1024], []
        in_flight = list(self._deleting)
        if keys:
            await self.delete_results(keys)
        if in_flight:
            await asyncio.wait(in_flight)

    async def wait(self, id, timeout, consume, run=None, resubmit=None):
        """Waits for id's result (client.h's Wait contract, timeout in seconds, None = none).
        With `run`, also returns run's rejection, and calls resubmit() after a silence."""
        loop = self.loop
        now = started = loop.time()
        deadline = None if timeout is None else now + timeout
        e = self.entries.get(id)
        if e is None:
            e = self.entries[id] = _Entry(now)
        e.nwait += 1
        try:
            backoff = FIRST_RECHECK
            next_read = now
            if e.ours and not e.has_result and not e.recheck and timeout != 0:
                # The notice says when to read; though not for all of a wait shorter than the
                # first re-check: that one reads halfway (its notice may have been lost), with
                # the other half for the read.
                next_read = now + (backoff if deadline is None else min(backoff, timeout / 2))
                backoff = FIRST_RECHECK * 2
            seen = e.version
            last_error = None
            read_after_rejection = False
            while True:
                if self.closed:
                    raise Unavailable("the client is closed", id=id)
                rec = e.record
                if rec is not None:
                    if e.nwait == 1:
                        e.record = None
                        self.held_bytes -= len(rec)
                    r = _protocol.decode_result(rec, id)
                    e.delivered = True
                    if consume and not e.consumed:  # it came inline: Redis holds it still
                        e.consumed = True
                        self._consume_later(id)
                    return r
                if run is not None and run.error is not None:
                    if run.sends < 2 or read_after_rejection:
                        raise run.error
                    # Rejected when sent again (after a silence): the job sent before may have
                    # ended just before the broker read this SUBMIT, which it then judged as a
                    # new job (queue_full, unknown_model). Redis is read once first: a result
                    # there is the job's.
                    read_after_rejection = True
                    next_read = loop.time()
                now = loop.time()
                if run is not None and not run.ever_sent and self._handshake_error() is not None \
                        and now - started >= self.timeout:
                    # Not sent because no handshake succeeds (a refused or wrong CURVE key):
                    # said now, not left to the deadline (run raises "it was not sent", why).
                    raise Unavailable(self._handshake_error(), id=id)
                if e.version != seen:
                    seen = e.version
                    if e.has_result or e.recheck:
                        next_read = now
                if now >= next_read:
                    e.recheck = False
                    # Bounded by what is left of the timeout, as the C++ SDK's Wait: a stalled
                    # Redis does not hold the wait for the client's whole timeout (a wait that
                    # checks once, timeout 0, gets that).
                    bound = max(deadline - now, 0.001) if deadline is not None and timeout else None
                    try:
                        raw = await self._read_raw(id, bound)
                        last_error = None
                    except Unavailable as err:  # Redis may be restarting: until the deadline
                        raw, last_error = None, err
                        if bound is not None and loop.time() >= deadline:
                            last_error = None  # cut off by the wait's own bound: a Timeout
                    if raw is not None:
                        if consume and e.nwait > 1 and e.record is None:
                            # Gone from Redis next: the others of this id take it from here, as
                            # an inline record (a copy: decoding consumes raw).
                            e.record = bytes(raw)
                            self.held_bytes += len(e.record)
                            e.has_result = True
                            self._changed(e)
                        if consume and not e.consumed:
                            # Read whole: deleted now; never before it came, so a read cut off
                            # loses nothing.
                            e.consumed = True
                            self._delete_read(id)
                        e.delivered = True
                        return _protocol.decode_result(raw, id)
                    now = loop.time()
                    next_read = now + backoff
                    backoff = min(backoff * 2, MAX_RECHECK)
                    # Silence: resubmit the same id (pending: a duplicate). Not once the wait is
                    # over (a read cut off at the deadline), which the resubmit would outlast.
                    if run is not None and resubmit is not None and run.sent \
                            and now - run.sent_at >= self.timeout and last_error is None \
                            and (deadline is None or now < deadline):
                        await resubmit()
                    continue
                if deadline is not None and now >= deadline:
                    if last_error is not None:
                        raise last_error
                    raise Timeout("no result for job %r within %g s" % (id, timeout), id=id)
                fut = self._wheel.sleep_until(next_read if deadline is None
                                              else min(next_read, deadline))
                if len(e.waiters) > 2 * e.nwait:
                    # The futures of earlier sleeps that the timer (not a notice) woke: else a
                    # long wait keeps one more per re-check, for as long as it waits.
                    e.waiters = [f for f in e.waiters if not f.done()]
                e.waiters.append(fut)
                await fut
        finally:
            e.nwait -= 1
            if e.nwait == 0 and (e.delivered or not e.ours) and self.entries.get(id) is e:
                self._erase(id)

    # ---- the result subscription (notify) -------------------------------------------------

    def notify_channel(self):
        if not self.opts.push_results or len(self.entries) > PUSH_MAX_TRACKED:
            return None
        if self._channel is not None:
            return self._channel
        if self._subscribing is None and self.loop.time() >= self._sub_retry_at:
            self._subscribing = self.loop.create_task(self._subscribe())
        return None

    async def _subscribe(self):
        channel = "%snotify:%s" % (self.prefix, uuid.uuid4())
        conn = None
        try:
            conn = await _resp.Connection.open(self.endpoint, self.loop, min(self.timeout, 1.0),
                                               on_push=self._on_push, on_lost=self._on_sub_lost,
                                               select_db=False)
            reply = await asyncio.wait_for(conn.call("SUBSCRIBE", channel),
                                           min(self.timeout, 1.0))
            if isinstance(reply, _resp.ReplyError):
                raise Unavailable("SUBSCRIBE: %s" % reply)
        except asyncio.CancelledError:  # close() while connecting or subscribing
            if conn is not None:
                conn._on_lost = None
                conn.close()
            raise
        except (Unavailable, asyncio.TimeoutError, OSError) as e:
            if conn is not None:
                conn._on_lost = None
                conn.close()
            self._on_error(e, counted=False)
            self._sub_backoff = min(max(self._sub_backoff * 2, PUSH_RETRY_MIN), PUSH_RETRY_MAX)
            self._sub_retry_at = self.loop.time() + self._sub_backoff
            return
        finally:
            self._subscribing = None
        if self.closed:
            conn._on_lost = None
            conn.close()
            return
        self._sub_backoff = 0.0
        self._sub = conn
        self._channel = channel
        if self._subscribed_before:
            self._recheck_ours()  # jobs sent to the old channel after it failed
        self._subscribed_before = True

    def _on_push(self, payload):
        try:
            body = msgpack.unpackb(payload, raw=False)
            self.finished(body.get("ids") or (), body.get("results"))
        except Exception as e:
            self._on_error(e)

    def _on_sub_lost(self):
        self._sub = None
        self._channel = None
        self._recheck_ours()  # notices published meanwhile are gone: read Redis now
