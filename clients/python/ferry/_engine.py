"""The client's engine: the broker's socket, and Redis for big inputs, on one asyncio loop.

One I/O task owns the DEALER socket (an actor, like the C++ SDK's I/O thread): callers queue
jobs and requests and kick it; each turn it builds messages from everything queued -- the jobs
of all the `run` calls made since its last turn go out as ONE ``SUBMIT`` (``"ack": false``), the
jobs of all `submit` calls as another (each split at 10,000 jobs or 32 MiB, or at
max_message_bytes or the broker's limits if less: _take), each with its jobs' attached inputs
as data frames after the body, in job order -- sends what the socket takes (a submit call's
jobs are marked sent then), then reads every message that has arrived (replies matched by
``rid``; ``FINISHED`` notices) and sleeps until a caller or the socket wakes it. The socket's
file descriptor is watched with ``loop.add_reader``.

The socket, its CURVE keys and its handshake monitor are opened by _socket.py.

The broker's limits (as the C++ SDK): the first request on every connection is the engine's own
``LIMITS``, and nothing else goes out until the broker has answered it (a broker from before
LIMITS answers ERROR: the configured max_message_bytes and 10,000 jobs stand then). SUBMITs are
split under the answer's max_message_bytes and max_jobs_per_message, and one still bigger (a
single big job) is not sent -- a frame over the broker's --max-message-bytes makes its libzmq drop
the connection without an answer -- but answered here with ERROR too_large. A lost connection
(the monitor's DISCONNECTED) makes the limits unknown again: the next one may be to a broker
restarted with other flags.

Results: ``FINISHED`` notices (with small records inline: ``inline_results``) go to the
client's `Results` (_results.py), which tracks each id, wakes its waiters and reads Redis. Big
inputs: `StoredInputs` (_inputs.py) writes them to Redis before their SUBMIT and deletes those
nobody will read.

Nothing here is thread-safe: every method runs on the loop (ferry.Client calls in through
run_coroutine_threadsafe).
"""

import asyncio
import itertools
import struct

import msgpack
import zmq

from . import _protocol, _resp
from ._errors import Unavailable
from ._inputs import StoredInputs
from ._requests import Request, RunBatch, SubmitBatch, SubmitCall
from ._results import Results
from ._socket import describe_handshake_failure, open_dealer

SEND_RETRY = 0.005              # s: re-check a socket that would not take a message
# s: how long a LIMITS waits for its answer before it goes out again while requests wait. One
# sent as the connection drops is lost without a trace (libzmq tells the monitor of the drop
# before it takes the dead connection's pipe away, and a send in between goes into that pipe).
LIMITS_RESEND = 0.5
_packer = msgpack.Packer(use_bin_type=True)
_pack = _packer.pack


class Engine:
    def __init__(self, options, loop):
        self.opts = options
        self.loop = loop
        self.prefix = options.redis_prefix
        self.timeout = options.request_timeout_ms / 1000.0
        self.endpoint = _resp.parse_redis_url(
            options.redis, options.redis_password_file, options.redis_tls_ca,
            options.redis_tls_cert, options.redis_tls_key)
        self.redis = _resp.Commands(self.endpoint, loop, self.timeout)
        self.results = Results(options, loop, self.redis, self.endpoint, self.timeout,
                               lambda: self.handshake_error, self._count_error)
        self.inputs = StoredInputs(self.redis, loop, options.input_ttl_s, self.timeout)
        self.closed = False
        self._rids = itertools.count(1)
        self._runs = []          # RunJob, queued for the next ack:false SUBMIT
        self._submits = []       # (Prepared, _SubmitCall), queued for the next SUBMIT
        self._requests = []      # (command, body, _Request)
        self._awaiting = {}      # rid -> handler
        self._stalled = None     # a message the socket refused after all: sent first
        # This connection's broker limits, (max_message_bytes, max_jobs_per_message); None
        # while unknown (no connection yet, or no answer to its LIMITS yet).
        self._limits = None
        self._limits_rid = None  # the LIMITS sent on this connection; None before it is sent
        self._limits_resend_at = 0.0  # loop time when an unanswered LIMITS goes out again
        self._wake = None
        self._kicked = False
        self._retry_timer = None
        self._last_sweep = self._last_entry_sweep = loop.time()
        # Counters, for stats and tests.
        self.messages_sent = 0
        self.callback_errors = 0
        self.last_error = None
        # Why the last handshake with the broker failed (a refused CURVE key, a wrong broker
        # key, CURVE on one side only), from the socket's monitor; None once one succeeds.
        self.handshake_error = None
        self._handshake_detailed = False

        self.ctx, self.sock, self._monitor = open_dealer(options)  # _socket.py
        self.curve = bool(options.curve_server_public)
        self._fd = self.sock.getsockopt(zmq.FD)
        self._monitor_fd = self._monitor.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self.kick)
        loop.add_reader(self._monitor_fd, self._read_monitor)
        self._read_monitor()  # ZMQ_FD is edge-triggered: consume what is pending now
        self._task = loop.create_task(self._io_loop())

    # ---- the I/O task --------------------------------------------------------------------

    def kick(self):
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)
        else:
            self._kicked = True

    async def _io_loop(self):
        loop = self.loop
        while not self.closed:
            self._kicked = False
            try:
                self._flush()
                self._drain()
                now = loop.time()
                if now - self._last_sweep >= 1.0:
                    self._sweep(now)
            except Exception as e:  # never leave the loop: count it, go on
                self._count_error(e)
            if self._kicked or self.closed:
                continue
            self._wake = loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    def _count_error(self, e, counted=True):
        self.callback_errors += counted
        self.last_error = e

    def _read_monitor(self):
        """Reads the socket monitor's events (edge-triggered: until none is left)."""
        mon = self._monitor
        try:
            while mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                frames = mon.recv_multipart(zmq.NOBLOCK)
                if len(frames[0]) < 6:
                    continue
                event, value = struct.unpack("=HI", frames[0][:6])
                if event == zmq.EVENT_DISCONNECTED:
                    # The next connection may be to another broker, or this one restarted with
                    # other flags: ask again before sending anything on it (a late answer to
                    # the LIMITS sent on this one is ignored).
                    self._limits = self._limits_rid = None
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.handshake_error, self._handshake_detailed = None, False
                    self.kick()  # LIMITS goes out now, not only once a request is queued
                elif event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    self.handshake_error = describe_handshake_failure(event, value, self.curve)
                    self._handshake_detailed = True
                elif not self._handshake_detailed:
                    # A peer that closes at once may give either event on a retry: keep the
                    # one with the reason.
                    self.handshake_error = describe_handshake_failure(event, value, self.curve)
        except zmq.ZMQError:
            pass

    def _writable(self):
        return self.sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT

    def _send(self, command, body, frames=(), batch=None, rid=None):
        """Sends one message: tag, command, body, then `frames` (attached inputs' data frames).
        copy=False: pyzmq sends a frame of at least zmq.COPY_THRESHOLD (64 KiB) from its
        buffer (a memoryview of the caller's array), holding it until libzmq is done with it;
        smaller ones it copies. The socket takes all of a message or, at its first frame,
        none (zmq.Again): it is then kept (`_stalled`) and sent first at the next turn.
        `batch`, a SubmitBatch: its calls are marked sent once the socket took it; `rid`, a
        SUBMIT's: a stalled one is checked against the broker's limit again before it goes."""
        try:
            if frames:
                self.sock.send_multipart([_protocol.TAG, command, body, *frames], zmq.NOBLOCK,
                                         copy=False)
            else:
                self.sock.send_multipart((_protocol.TAG, command, body), zmq.NOBLOCK, copy=False)
            self.messages_sent += 1
        except zmq.Again:
            self._stalled = (command, body, frames, batch, rid)
            return False
        if batch is not None:
            batch.mark_sent()
        return True

    def _retry_later(self):
        if self._retry_timer is None:
            def fire():
                self._retry_timer = None
                self.kick()
            self._retry_timer = self.loop.call_later(SEND_RETRY, fire)

    def _queued(self):
        return self._stalled is not None or self._requests or self._submits or self._runs

    def _flush(self):
        if self._limits is None:
            # A connection's first request is LIMITS; nothing else goes out before its answer
            # (held in order: _drain kicks when it comes).
            if self._limits_due():
                if self._writable():
                    self._send_limits()
                elif self._queued():
                    self._retry_later()
            return
        while self._queued():
            if not self._writable():
                self._retry_later()
                return
            if self._stalled is not None:
                command, body, frames, batch, rid = self._stalled
                self._stalled = None
                if batch is not None and not batch.alive():
                    continue  # its callers gave up (unsent_preps) before it went out
                if rid is not None and self._refused(rid, body, frames):
                    continue  # the broker's limit is lower on this connection
                if not self._send(command, body, frames, batch, rid):
                    self._retry_later()
                    return
                continue
            if self._requests:
                command, body, handler = self._requests.pop(0)
                if not handler.alive():
                    continue
                rid = next(self._rids)
                body["rid"] = rid
                self._awaiting[rid] = handler
                packed = _pack(body)
                if not self._refused(rid, packed, (), command.decode()):  # a big CANCEL
                    self._send(command, packed)
            elif self._submits:
                self._send_submits()
            else:
                self._send_runs()

    def _limits_due(self):
        """Whether LIMITS goes out: not yet sent on this connection, or unanswered for
        LIMITS_RESEND while requests wait behind it."""
        if self._limits_rid is None:
            return True
        return bool(self._queued()) and self.loop.time() >= self._limits_resend_at

    def _send_limits(self):
        # A resend keeps the rid: whichever answer comes first is taken, the others ignored.
        rid = self._limits_rid if self._limits_rid is not None else next(self._rids)
        try:
            self.sock.send_multipart((_protocol.TAG, b"LIMITS", _pack({"rid": rid})),
                                     zmq.NOBLOCK)
        except zmq.Again:
            self._retry_later()  # not sent: the next turn tries again
            return
        self.messages_sent += 1
        self._limits_rid = rid
        self._limits_resend_at = self.loop.time() + LIMITS_RESEND
        self.loop.call_later(LIMITS_RESEND, self.kick)  # a turn then to see whether it is due

    def _on_limits(self, command, body):
        """The answer to this connection's LIMITS; an ERROR (unknown_command from a broker from
        before LIMITS) or a body it cannot read: the limits this client was configured with."""
        limits = _protocol.decode_limits(command, body)
        if limits is None:
            limits = (self.opts.max_message_bytes, _protocol.MAX_JOBS_PER_MESSAGE, 0)
        self._limits = limits
        self.kick()  # what was held goes out now

    def _broker_limits(self):
        """The broker's (max_message_bytes, max_jobs_per_message, max_job_bytes); while unknown
        (nothing is sent then), the configured ones and no job limit (0)."""
        if self._limits is not None:
            return self._limits
        return self.opts.max_message_bytes, _protocol.MAX_JOBS_PER_MESSAGE, 0

    def message_limits(self):
        """The most bytes and jobs (or ids) one SUBMIT (or CANCEL) may carry: this client's
        limits, or the broker's where lower once its LIMITS answer came."""
        broker_bytes, broker_jobs, _ = self._broker_limits()
        return (min(_protocol.MAX_MESSAGE_BYTES, self.opts.max_message_bytes, broker_bytes),
                min(_protocol.MAX_JOBS_PER_MESSAGE, broker_jobs))

    def broker_max_job_bytes(self):
        """The broker's --max-job-bytes from this connection's LIMITS; 0 while unknown (or a
        broker from before LIMITS). Read from any thread: one attribute read."""
        limits = self._limits
        return limits[2] if limits is not None else 0

    def _refused(self, rid, body, frames, command="SUBMIT"):
        """Whether request `rid` is over the broker's max_message_bytes, and so answered here
        instead of sent, as if the broker had answered ERROR too_large: a frame over its limit
        makes its libzmq drop the connection without an answer (a run would resubmit for
        ever)."""
        nbytes = len(body) + sum(memoryview(f).nbytes for f in frames)
        limit = self._broker_limits()[0]
        if nbytes <= limit:
            return False
        handler = self._awaiting.pop(rid, None)
        if handler is not None:
            message = _protocol.too_large_message(nbytes, limit, command)
            handler.reply("ERROR", {"code": "too_large", "rid": rid, "message": message})
        return True

    def _take(self, queue, prep_of):
        """The head of `queue` that fits one message: unique ids, at most 10,000 jobs (or the
        broker's max_jobs_per_message: it refuses a bigger SUBMIT as a whole), <= 32 MiB (or
        max_message_bytes, or the broker's, if less) of body and data frames (one job more)."""
        taken, ids = [], set()
        size = _protocol.submit_header_bytes(self.opts.redis_prefix)
        limit, max_jobs = self.message_limits()
        n = 0
        for item in queue:
            p = prep_of(item)
            if p is None:
                n += 1
                continue
            if taken and (p.id in ids or size + p.size > limit
                          or len(taken) >= max_jobs):
                break
            taken.append(item)
            ids.add(p.id)
            size += p.size
            n += 1
        del queue[:n]
        return taken, ids

    def _header(self, njobs, ack, rid):
        notify = self.results.notify_channel()
        fields = 3 + (notify is not None) + (not ack)
        parts = [_packer.pack_map_header(fields)]
        if notify is not None:
            parts.append(_pack("notify"))
            parts.append(_pack(notify))
        if not ack:
            parts.append(_pack("ack"))
            parts.append(_pack(False))
        parts.append(_pack("inline_results"))
        parts.append(_pack(True))
        parts.append(_pack("rid"))
        parts.append(_pack(rid))
        parts.append(_pack("jobs"))
        parts.append(_packer.pack_array_header(njobs))
        return parts

    def _send_runs(self):
        jobs, _ = self._take(self._runs, lambda j: None if j.cancelled else j.prep)
        if not jobs:
            return
        rid = next(self._rids)
        parts = self._header(len(jobs), False, rid)
        frames = []  # the attached inputs' data frames: jobs in order, inputs in order
        for j in jobs:
            parts.append(j.prep.packed)
            if j.prep.frames:
                frames.extend(j.prep.frames)
            j.queued = False
            j.rid = rid
        body = b"".join(parts)
        self._awaiting[rid] = RunBatch(self, jobs, rid)
        if self._refused(rid, body, frames):
            return  # rejected too_large, never sent
        now = self.loop.time()
        for j in jobs:
            j.sent = j.ever_sent = True
            j.sends += 1
            j.sent_at = now
        self._send(b"SUBMIT", body, frames, None, rid)

    def _send_submits(self):
        items, ids = self._take(self._submits,
                                lambda it: None if it[1].future.done() else it[0])
        if not items:
            return
        rid = next(self._rids)
        parts = self._header(len(items), True, rid)
        calls = []
        frames = []  # as in _send_runs
        for p, call in items:
            parts.append(p.packed)
            if p.frames:
                frames.extend(p.frames)
            if not calls or calls[-1] is not call:
                calls.append(call)
        body = b"".join(parts)
        batch = self._awaiting[rid] = SubmitBatch(calls, ids, items)
        # Refused here, its jobs are not marked sent: their stored inputs are nobody's (the
        # caller deletes those of jobs rejected too_large).
        if not self._refused(rid, body, frames):
            self._send(b"SUBMIT", body, frames, batch, rid)

    def _drain(self):
        sock = self.sock
        for _ in range(4096):
            events = sock.getsockopt(zmq.EVENTS)
            if not events & zmq.POLLIN:
                if events & zmq.POLLOUT and self._limits is None and self._limits_rid is None:
                    # Connected since _flush looked, and this read took the FD's edge: LIMITS
                    # goes out now, not at the next request.
                    self.kick()
                return
            frames = sock.recv_multipart(zmq.NOBLOCK)
            if len(frames) != 3 or frames[0] != _protocol.TAG:
                continue  # not Ferry framing: dropped
            try:
                body = msgpack.unpackb(frames[2], raw=False) if frames[2] else {}
                if type(body) is not dict:
                    continue
                command = frames[1].decode("ascii", "replace")
                if command == "FINISHED":
                    self.results.finished(body.get("ids") or (), body.get("results"))
                    continue
                rid = body.get("rid")
                if self._limits is None and rid is not None and rid == self._limits_rid:
                    self._on_limits(command, body)
                    continue
                handler = self._awaiting.pop(rid, None)
                if handler is not None:
                    handler.reply(command, body)
            except Exception as e:
                self._count_error(e)
        self.kick()  # more than a turn's worth: come back after the others had a go

    def _sweep(self, now):
        self._last_sweep = now
        for rid in [r for r, h in self._awaiting.items() if not h.alive()]:
            del self._awaiting[rid]
        # Queued work whose callers gave up while no broker took anything.
        self._runs = [j for j in self._runs if not j.cancelled]
        self._submits = [it for it in self._submits if not it[1].future.done()]
        self._requests = [r for r in self._requests if r[2].alive()]
        if now - self._last_entry_sweep >= 5.0:
            self._last_entry_sweep = now
            self.results.sweep(now)

    # ---- what the client calls ------------------------------------------------------------

    def queue_run(self, job):
        job.error = None
        job.sent = False
        if self.closed:
            return  # its wait raises Unavailable (the client is closed)
        job.queued = True
        self._runs.append(job)
        self.kick()

    def reject(self, job, err):
        job.sent = False
        job.error = err
        self.results.wake(job.prep.id)

    def queue_submit(self, preps):
        call = SubmitCall(preps, self.loop.create_future())
        if self.closed:
            call.future.set_exception(Unavailable("the client is closed"))
            return call
        for p in preps:
            self._submits.append((p, call))
        self.kick()
        return call

    def unsent_preps(self, call):
        """The jobs of a submit call that gave up (its future is done) that never went out and
        now never will: queued ones are skipped, and a stalled SUBMIT whose callers all gave up
        is dropped here. A stalled SUBMIT another call still waits on goes out: its jobs count
        as sent."""
        going = ()
        st = self._stalled
        if st is not None and st[3] is not None and call in st[3].calls:
            if st[3].alive():
                going = st[3].ids
            else:
                self._stalled = None
        return [p for p in call.preps if p.id not in call.sent and p.id not in going]

    async def request(self, command, body, expected):
        if self.closed:
            raise Unavailable("the client is closed")
        fut = self.loop.create_future()
        handler = Request(fut, expected)
        self._requests.append((command, body, handler))
        self.kick()
        try:
            return await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            raise Unavailable(self.silence_message(command.decode(), self.opts.request_timeout_ms))

    def _why(self):
        self._read_monitor()
        if self.handshake_error is not None:
            return self.handshake_error
        why = "is ferry-broker running and reachable?"
        if self.curve:
            why += (" CURVE is on: a wrong curve_server_public or a key the broker does not "
                    "allow also looks like this")
        return why

    def silence_message(self, what, ms):
        return ("broker at %s did not answer %s within %d ms (%s)"
                % (self.opts.frontend, what, ms, self._why()))

    def unsent_message(self, timeout):
        within = "" if timeout is None else " within %g s" % timeout
        return ("no broker at %s took the job%s (%s); it was not sent"
                % (self.opts.frontend, within, self._why()))

    async def close(self):
        if self.closed:
            return
        self.closed = True
        self.kick()
        try:
            self.loop.remove_reader(self._fd)
        except Exception:
            pass
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self.results.close()
        self._task.cancel()
        # Every call waiting for a reply ends now: requests, submits queued or sent (runs raise
        # from their wait: Results.close).
        def closed():
            return Unavailable("the client is closed")
        for _, _, h in self._requests:
            if not h.future.done():
                h.future.set_exception(closed())
        for h in self._awaiting.values():
            if isinstance(h, Request):
                if not h.future.done():
                    h.future.set_exception(closed())
            elif isinstance(h, SubmitBatch):
                h.fail(closed)
        unsent = [p for p, call in self._submits if p.id not in call.sent]
        unsent += [j.prep for j in self._runs if not j.ever_sent]
        if self._stalled is not None and self._stalled[3] is not None:
            unsent += [p for p, call in self._stalled[3].items if p.id not in call.sent]
        for _, call in self._submits:
            if not call.future.done():
                call.future.set_exception(closed())
        self._requests, self._submits, self._runs, self._stalled = [], [], [], None
        # The stored inputs of jobs that never went out are nobody's.
        await self.inputs.delete_unsent_at_close(unsent)
        # So are consumed results still waiting for their deletion (the same bound).
        if self.results.deletes_due() and self.redis.connected():
            try:
                await asyncio.wait_for(self.results.finish_deletes(), min(self.timeout, 1.0))
            except Exception:
                pass
        self.redis.close()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        try:
            self.loop.remove_reader(self._monitor_fd)
        except Exception:
            pass
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
        self.sock.close(0)
        self.ctx.term()
