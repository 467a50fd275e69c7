"""ferry.AsyncClient: the client as asyncio coroutines."""

import asyncio

from . import _protocol
from ._engine import Engine
from ._requests import RunJob
from ._errors import FerryError, InvalidArgument, Timeout, TooLarge, Unavailable

__all__ = ["AsyncClient", "CancelReport"]


class CancelReport(tuple):
    """What the broker did with the ids of one cancel() call (every id in exactly one list):
    cancelled (were queued: their result is now "cancelled"), running (not final yet, the
    result tells: on a worker, dropped there if their batch has not started; or queued while
    Redis did not take their "cancelled" result), not_found (not pending: unknown or
    finished)."""

    __slots__ = ()

    def __new__(cls, cancelled, running, not_found):
        return tuple.__new__(cls, (cancelled, running, not_found))

    cancelled = property(lambda self: self[0])
    running = property(lambda self: self[1])
    not_found = property(lambda self: self[2])

    def __repr__(self):
        return "CancelReport(cancelled=%r, running=%r, not_found=%r)" % self


def owns_inputs(rejection, prep):
    """Whether a rejected job's stored inputs are nobody's once it is rejected, so the client
    deletes them: not for `duplicate` (they are the pending job's, same id, same keys) nor for
    `unavailable` (the broker may have dispatched the job before its journal write failed: the
    worker still reads them). Those expire (input_ttl_s) or the worker deletes them. A SUBMIT
    refused whole (an ERROR, naming no job: the broker read none of them) says nothing about a
    caller's id, which may be a pending job's: only those of ids the client made go then
    (_requests.unnamed_error; an error without an id is one of the whole call too)."""
    if rejection.code in ("duplicate", "unavailable"):
        return False
    if getattr(rejection, "unnamed", False) or rejection.id is None:
        return prep.own_id
    return True


class AsyncClient:
    """Submits jobs to a Ferry broker and reads their results, on asyncio.

        async with ferry.AsyncClient() as client:
            result = await client.run("tiny", np.ones(8, np.float32), timeout=10)

    Every coroutine runs on the event loop the client first ran on (it binds to it then):
    thousands of concurrent ``await client.run(...)`` share one socket, and the runs started
    in one turn of the loop travel to the broker as one SUBMIT (per 10,000 jobs or 32 MiB, or
    max_message_bytes or the broker's limits, asked on each connection, if less).
    Not thread-safe: use it from its loop only (ferry.Client is the thread-safe, blocking
    client).

    Options (keywords; the C++ SDK's ClientOptions, same names and defaults): redis_prefix,
    request_timeout_ms, push_results, stored_input_bytes, attached_input_bytes,
    max_message_bytes, input_ttl_s, consume_results, curve_server_public, curve_secret,
    redis_password_file, redis_tls_ca, redis_tls_cert, redis_tls_key. frontend and redis
    default to $FERRY_FRONTEND and $FERRY_REDIS, then tcp://127.0.0.1:5555 and
    redis://127.0.0.1:6379; redis_prefix, the CURVE and the Redis file options and
    max_message_bytes to $FERRY_REDIS_PREFIX, $FERRY_CURVE_SERVER_PUBLIC, $FERRY_CURVE_SECRET,
    $FERRY_REDIS_PASSWORD_FILE, $FERRY_REDIS_TLS_CA/_CERT/_KEY and $FERRY_MAX_MESSAGE_BYTES
    (what `ferry up --env-file` writes). See docs/python.md.
    """

    def __init__(self, frontend=None, redis=None, **options):
        self.options = _protocol.Options(frontend, redis, **options)
        # Checked now (a bad URL or key file fails here, not at the first call).
        from . import _resp
        o = self.options
        _resp.parse_redis_url(o.redis, o.redis_password_file, o.redis_tls_ca, o.redis_tls_cert,
                              o.redis_tls_key)
        self._engine = None
        self._closed = False

    # ---- internals --------------------------------------------------------------------------

    def _get_engine(self):
        e = self._engine
        if e is not None:
            if e.loop is not asyncio.get_running_loop():
                raise InvalidArgument("this AsyncClient runs on another event loop (a client "
                                      "binds to the loop it first ran on)")
            return e
        if self._closed:
            raise Unavailable("the client is closed")
        self._engine = Engine(self.options, asyncio.get_running_loop())
        return self._engine

    def _prepare(self, model, inputs, id, priority, timeout_ms, result_ttl_s, own_id=False):
        o = self.options
        engine = self._engine
        return _protocol.prepare(model, inputs, id, priority, timeout_ms, result_ttl_s,
                                 o.stored_input_bytes, o.redis_prefix, o.attached_input_bytes,
                                 o.max_message_bytes,
                                 engine.broker_max_job_bytes() if engine is not None else 0,
                                 own_id)

    @staticmethod
    def _timeout(timeout):
        if timeout is None:
            return None
        if timeout < 0:
            raise InvalidArgument("timeout must be >= 0 seconds or None (no limit)")
        return float(timeout)

    # ---- the API ----------------------------------------------------------------------------

    async def submit(self, model, *inputs, id=None, priority=0, timeout_ms=0, result_ttl_s=0):
        """Submits one job; returns its id once the broker accepted it. Raises the rejection
        (UnknownModel, QueueFull, TooLarge, Duplicate, InvalidArgument, ...; .id is the job's
        id, to resubmit a retryable one with) or Unavailable when the broker did not answer
        within request_timeout_ms (the job may or may not be accepted: resubmit the same id)."""
        prep = self._prepare(model, inputs, id, priority, timeout_ms, result_ttl_s)
        try:
            return (await self._submit_prepared([prep]))[0]
        except FerryError as e:
            if e.id is None:  # an error of the whole call (the client closed, Redis failed)
                e.id = prep.id
            raise

    async def submit_many(self, jobs):
        """Submits jobs (ferry.Job or dicts) in one SUBMIT per 32 MiB (or max_message_bytes or the
        broker's limit, if less) or 10,000 jobs; returns their ids in order. If any job is not
        accepted, raises the first one's error (in job order) with .ids (every id, in order),
        .accepted (the accepted ids: wait for these) and .errors ({id: FerryError}, the others). A
        job that fails the client's own checks (InvalidArgument, TooLarge) is not sent, and the
        others are. A call the client cannot name every job of (not a ferry.Job or dict, an invalid
        id, or an id given twice) raises InvalidArgument before anything is sent, with .ids [],
        .accepted [] and .errors {}."""
        ids, preps, local = self._prepare_many(jobs)
        return await self._submit_many_prepared(ids, preps, local)

    def _prepare_many(self, jobs):
        """(ids, preps, local): every job's id in order, the jobs to send, and {id: error} of
        those the client's own checks keep back."""
        ids, preps, local, seen = [], [], {}, set()
        try:
            for j in jobs:
                j = _protocol.Job.of(j)
                id = _protocol.new_id() if j.id is None else _protocol.check_id(j.id)
                if id in seen:
                    raise InvalidArgument("id %r appears twice in one submit_many" % id, id=id)
                seen.add(id)
                ids.append(id)
                try:
                    preps.append(self._prepare(j.model, j.inputs, id, j.priority, j.timeout_ms,
                                               j.result_ttl_s, own_id=j.id is None))
                except FerryError as e:
                    local[id] = e
        except FerryError as e:  # nothing is sent
            e.ids, e.accepted, e.errors = [], [], {}
            raise
        return ids, preps, local

    async def _submit_many_prepared(self, ids, preps, local):
        if not local:
            return await self._submit_prepared(preps) if preps else []
        accepted, errors = [], dict(local)
        if preps:
            try:
                accepted = await self._submit_prepared(preps)
            except FerryError as e:  # rejections (with .accepted and .errors), or none answered
                accepted = getattr(e, "accepted", [])
                errors.update(getattr(e, "errors", None) or {p.id: e for p in preps})
        first = next(errors[i] for i in ids if i in errors)  # in the caller's order
        first.ids, first.accepted, first.errors = ids, accepted, errors
        raise first

    async def _submit_prepared(self, preps):
        engine = self._get_engine()
        ids = [p.id for p in preps]
        await self._store_inputs(engine, preps)
        engine.results.track(ids)  # before sending: a result may come before the reply
        call = engine.queue_submit(preps)
        try:
            verdicts = await asyncio.wait_for(call.future, engine.timeout)
        except asyncio.TimeoutError:
            # A call split into several SUBMITs may have verdicts for some: those stand. The
            # others may be accepted: untracked, a wait then reads Redis before sleeping.
            verdicts = dict(call.verdicts)
            rejected = {i: v for i, v in verdicts.items() if v is not None}
            engine.results.untrack([i for i in ids if i not in verdicts or i in rejected])
            # The jobs that never went out (no broker connected) will not now: their stored
            # inputs are nobody's, nor are those of jobs rejected for good. Those sent and not
            # answered may be accepted: theirs stay (input_ttl_s).
            engine.inputs.delete_unsent(engine.unsent_preps(call))
            engine.inputs.delete([p for p in preps
                                  if p.id in rejected and owns_inputs(rejected[p.id], p)])
            err = Unavailable(engine.silence_message("SUBMIT", self.options.request_timeout_ms),
                              id=next((i for i in ids if i not in verdicts), ids[0]))
            err.ids = ids
            err.accepted = [i for i in ids if i in verdicts and i not in rejected]
            err.errors = {i: rejected.get(i, err) for i in ids if i not in err.accepted}
            raise err
        except BaseException:  # cancelled, or the client closed (Engine.close deletes then)
            engine.results.untrack(ids)
            if not engine.closed:
                engine.inputs.delete_unsent(engine.unsent_preps(call))
            raise
        errors = {i: v for i, v in verdicts.items() if v is not None}
        if not errors:
            return ids
        engine.results.untrack(list(errors))
        engine.inputs.delete([p for p in preps
                              if p.id in errors and owns_inputs(errors[p.id], p)])
        first = next(errors[i] for i in ids if i in errors)
        first.ids = ids
        first.accepted = [i for i in ids if i not in errors]
        first.errors = errors
        raise first

    @staticmethod
    async def _store_inputs(engine, preps, timeout=None):
        """Writes the jobs' stored inputs before their SUBMIT (within `timeout` s, when not None:
        a run's); if that fails or is cancelled partway (Redis took some, then refused one;
        asyncio.wait_for around a run), deletes them again: the SUBMIT is not sent, so nobody
        reads them (StoredInputs.delete_unsent)."""
        try:
            await engine.inputs.store(preps, timeout)
        except BaseException:
            if not engine.closed:
                engine.inputs.delete_unsent(preps)
            raise

    async def wait(self, id, timeout=None):
        """The result of job `id` (status done, failed, cancelled or expired), waiting up to
        `timeout` seconds (None: no limit; 0: check once). Raises Timeout when none came in
        time (the job may still finish: wait again), Unavailable when Redis stayed unreachable
        until then. Wakes at once on the broker's or the worker's notice for jobs submitted
        here; otherwise re-checks Redis every 50 ms, backing off to 1 s."""
        _protocol.check_id(id)
        engine = self._get_engine()
        return await engine.results.wait(id, self._timeout(timeout), self.options.consume_results)

    async def poll(self, id):
        """The result of job `id` if it has one now, else None (pending, unknown or expired:
        Redis cannot tell). Never deletes the result (consume_results does not apply)."""
        _protocol.check_id(id)
        return await self._get_engine().results.read(id)

    async def run(self, model, *inputs, timeout=None, **job_options):
        """Submits one job and waits for its result (job_options: id, priority, timeout_ms,
        result_ttl_s). The SUBMIT asks for no ACCEPTED ("ack": false): one message and one
        wake-up per job. Raises the job's rejection (UnknownModel, QueueFull, TooLarge,
        InvalidArgument; a duplicate id means that job is pending: its result is returned);
        rejected `unavailable` is resubmitted (same id) after a back-off until `timeout`; after
        request_timeout_ms without a result the same id is resubmitted too (a pending job is
        then a duplicate: nothing runs twice). Raises Timeout when `timeout` seconds pass
        (run again with the same id to keep waiting), Unavailable when no broker took the job
        at all ("it was not sent")."""
        prep, timeout = self._prepare_run(model, inputs, timeout, job_options)
        return await self._run_prepared(prep, timeout)

    def _prepare_run(self, model, inputs, timeout, job_options):
        unknown = set(job_options) - {"id", "priority", "timeout_ms", "result_ttl_s"}
        if unknown:
            raise TypeError("run() got unknown job option(s): %s" % ", ".join(sorted(unknown)))
        timeout = self._timeout(timeout)
        if timeout == 0:
            raise InvalidArgument("run needs a timeout > 0 (or None); to check once, use poll")
        prep = self._prepare(model, inputs, job_options.get("id"), job_options.get("priority", 0),
                             job_options.get("timeout_ms", 0), job_options.get("result_ttl_s", 0))
        return prep, timeout

    async def _run_prepared(self, prep, timeout):
        engine = self._get_engine()
        consume = self.options.consume_results
        id = prep.id
        if engine.results.finished_here(id):  # a run again after a timeout, whose result came since
            return await engine.results.wait(id, timeout, consume)
        loop = engine.loop
        deadline = None if timeout is None else loop.time() + timeout
        job = RunJob(prep)

        async def resubmit():
            job.sent_at = loop.time()
            # The inputs written for the first SUBMIT are most likely still there (only the
            # final result deletes them): their expiry is renewed, and only those Redis lost
            # meanwhile are written again -- not every input at every silence (a 1 MB input
            # every request_timeout_ms, times every run waiting in a long queue, would load
            # Redis most when it is busiest).
            if prep.stored:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return  # the run is over
                try:
                    await engine.inputs.refresh(prep, left)  # within the run's time left
                except Unavailable:
                    return  # Redis is away: the next silence tries again
            engine.queue_run(job)

        if prep.stored:  # within the run's timeout: a stalled Redis holds it no longer
            await self._store_inputs(engine, [prep], timeout)
        engine.results.track((id,))
        engine.queue_run(job)
        ok = False
        backoff = 0.05
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    r = await engine.results.wait(id, left, consume, run=job, resubmit=resubmit)
                    ok = True
                    return r
                except Unavailable as err:
                    if err is not job.error:
                        if engine.closed:
                            raise
                        if not job.ever_sent:
                            raise Unavailable(engine.unsent_message(timeout), id=id) from err
                        raise
                    # The broker could not journal the job: back off, resubmit the same id.
                    if deadline is not None and loop.time() + backoff >= deadline:
                        raise
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    await resubmit()
                except Timeout:
                    if not job.ever_sent:
                        raise Unavailable(engine.unsent_message(timeout), id=id)
                    ok = True  # sent: the caller may run again with the same id
                    raise
        finally:
            job.cancelled = True
            if not ok:
                engine.results.untrack((id,))
                if not job.ever_sent:
                    engine.inputs.delete_unsent([prep])  # nobody will read them
                elif job.error is not None and owns_inputs(job.error, prep):
                    engine.inputs.delete([prep])

    async def cancel(self, *ids):
        """Cancels jobs (one CANCEL per 10,000 ids, or per the broker's --max-jobs-per-message
        and --max-message-bytes when lower); returns a CancelReport (cancelled, running,
        not_found)."""
        if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
            ids = tuple(ids[0])
        for i in ids:
            _protocol.check_id(i)
        engine = self._get_engine()
        report = CancelReport([], [], [])
        # The broker refuses more ids whole and drops the connection on a bigger frame (the
        # engine answers such a CANCEL too_large instead of sending it). One refused because the
        # broker's limits came meanwhile is split again under them.
        begin, splits_again = 0, 0
        while begin < len(ids):
            limits = engine.message_limits()
            max_bytes, max_ids = limits
            end, size = begin, 64  # the map and rid; each id: its bytes and a msgpack head
            while end < len(ids) and end - begin < max_ids and (
                    end == begin or size + len(ids[end]) + 3 <= max_bytes):
                size += len(ids[end]) + 3
                end += 1
            try:
                body = await engine.request(b"CANCEL", {"ids": list(ids[begin:end])},
                                            "CANCELLED")
            except TooLarge:
                if end - begin > 1 and engine.message_limits() != limits and splits_again < 3:
                    splits_again += 1
                    continue
                raise
            for into, key in zip(report, ("ids", "running", "not_found")):
                into.extend(body.get(key) or ())
            begin = end
        return report

    async def stats(self):
        """The broker's statistics: workers, queues, pending, counters (docs/protocol.md)."""
        body = await self._get_engine().request(b"STATS", {}, "STATS")
        body.pop("rid", None)
        return body

    async def close(self):
        """Closes the socket and Redis connections; calls in progress (waits, runs, submits
        waiting for the broker's answer, requests) raise Unavailable. The stored inputs of jobs
        that never went out are deleted first."""
        self._closed = True
        if self._engine is not None:
            await self._engine.close()

    async def __aenter__(self):
        self._get_engine()
        return self

    async def __aexit__(self, *exc):
        await self.close()
