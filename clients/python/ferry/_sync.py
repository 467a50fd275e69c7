"""ferry.Client: the blocking, thread-safe client (an AsyncClient on a loop of its own)."""

import asyncio
import threading

from . import _protocol
from ._aio import AsyncClient
from ._errors import InvalidArgument, Unavailable

__all__ = ["Client"]


class Client:
    """Submits jobs to a Ferry broker and reads their results, blocking the calling thread.

        with ferry.Client() as client:
            result = client.run("tiny", np.ones(8, np.float32), timeout=10)
            print(result.outputs[0])

    Thread-safe: any number of threads may call any method at once; share one client per
    process. Inside, one background thread runs an asyncio loop with an AsyncClient that owns
    the socket and the Redis connections; a calling thread checks and encodes its job itself,
    hands it to that loop and sleeps until its answer. Create clients after fork(), not before.

    Methods, options and errors are AsyncClient's (see there and docs/python.md).
    """

    def __init__(self, frontend=None, redis=None, **options):
        self._aio = AsyncClient(frontend, redis, **options)
        self.options = self._aio.options
        self._closed = False
        self._close_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _closed and _pending
        self._pending = set()  # the futures of calls in progress (close fails those left)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ferry-client-io",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._aio.__aenter__())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro):
        if threading.current_thread() is self._thread:
            coro.close()
            raise InvalidArgument("ferry.Client called from its own I/O thread")
        with self._lock:
            if self._closed:
                coro.close()
                raise Unavailable("the client is closed")
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._pending.add(fut)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt: the coroutine stops where it waits
            raise
        finally:
            with self._lock:
                self._pending.discard(fut)

    def submit(self, model, *inputs, id=None, priority=0, timeout_ms=0, result_ttl_s=0):
        """See AsyncClient.submit."""
        prep = self._aio._prepare(model, inputs, id, priority, timeout_ms, result_ttl_s)
        return self._call(self._aio._submit_prepared([prep]))[0]

    def submit_many(self, jobs):
        """See AsyncClient.submit_many."""
        ids, preps, local = self._aio._prepare_many(jobs)
        if not ids:
            return []
        return self._call(self._aio._submit_many_prepared(ids, preps, local))

    def wait(self, id, timeout=None):
        """See AsyncClient.wait."""
        _protocol.check_id(id)
        return self._call(self._aio.wait(id, timeout))

    def poll(self, id):
        """See AsyncClient.poll."""
        _protocol.check_id(id)
        return self._call(self._aio.poll(id))

    def run(self, model, *inputs, timeout=None, **job_options):
        """See AsyncClient.run."""
        prep, timeout = self._aio._prepare_run(model, inputs, timeout, job_options)
        return self._call(self._aio._run_prepared(prep, timeout))

    def cancel(self, *ids):
        """See AsyncClient.cancel."""
        return self._call(self._aio.cancel(*ids))

    def stats(self):
        """See AsyncClient.stats."""
        return self._call(self._aio.stats())

    def close(self):
        """Closes the client: calls in progress in other threads (waits, runs, submits waiting
        for the broker's answer, requests) raise Unavailable; idempotent."""
        with self._close_lock:
            with self._lock:
                if self._closed:
                    return
                self._closed = True  # calls from now on raise Unavailable at once
            try:
                asyncio.run_coroutine_threadsafe(self._close_on_loop(), self._loop).result(10)
            except Exception:
                pass
            self._stop_loop()
            # A call whose coroutine did not end (the loop is stopped now) must not wait forever.
            with self._lock:
                left, self._pending = self._pending, set()
            for fut in left:
                if not fut.done():
                    try:
                        fut.set_exception(Unavailable("the client is closed"))
                    except Exception:  # it ended meanwhile
                        pass

    async def _close_on_loop(self):
        await self._aio.close()
        # The calls in progress end with Unavailable now; let them, briefly, before the loop
        # stops (close() fails those that did not).
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    def _stop_loop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # not closed: stop the loop thread, without waiting for anything
        try:
            if not self._closed:
                self._closed = True
                self._loop.call_soon_threadsafe(self._loop.stop)
        except Exception:
            pass
