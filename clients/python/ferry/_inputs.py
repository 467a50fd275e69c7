"""The jobs' big inputs in Redis (the claim check, protocol.md "Stored inputs"): written before
their SUBMIT, renewed (or written again where Redis lost them) before a run resubmits, deleted
where nobody will read them.

A job's stored inputs are (key, bytes) pairs (`Prepared.stored`), each SET with an expiry of
input_ttl_s: a job whose SUBMIT never reached a broker, or that a broker rejected for good,
leaves nothing behind for longer than that even when its deletion fails. Whoever writes a job's
final result deletes its inputs with it: the worker, or the broker for a job it ends itself.
Every method runs on the engine's loop, on the engine's command connection (_resp.Commands).
"""

import asyncio

from . import _resp
from ._errors import Unavailable


class StoredInputs:
    def __init__(self, redis, loop, ttl_s, timeout):
        self.redis = redis      # the engine's _resp.Commands
        self.loop = loop
        self.ttl_s = ttl_s
        self.timeout = timeout  # s: the bound on the deletions made at close

    async def store(self, preps, timeout=None):
        """Writes the stored inputs of these jobs to Redis, one round trip (within `timeout` s,
        as execute's)."""
        await self._set([stored for p in preps if p.stored for stored in p.stored], timeout)

    async def refresh(self, prep, timeout=None):
        """Before a resubmit: renews the expiry of the job's stored inputs (EXPIRE, a few bytes
        each) and writes again only those Redis no longer has -- a restart without persistence,
        a failover, an eviction -- or will not renew (an ACL of before, without EXPIRE): the
        worker that takes the resubmitted job finds every input. `timeout`: as execute's, for
        both round trips (a run's time left)."""
        deadline = None if timeout is None else self.loop.time() + timeout
        try:
            replies = await self.redis.execute_many(
                [("EXPIRE", key, self.ttl_s) for key, _ in prep.stored], timeout)
        except Unavailable as e:
            raise Unavailable("renewing big inputs in Redis: %s" % e.message)
        lost = [stored for stored, r in zip(prep.stored, replies) if r != 1]
        if lost:
            await self._set(
                lost, None if deadline is None else max(0.0, deadline - self.loop.time()))

    async def _set(self, pairs, timeout=None):
        """SETs these (key, bytes) pairs, expiring in input_ttl_s, in one round trip."""
        cmds = [("SET", key, data, "EX", self.ttl_s) for key, data in pairs]
        if not cmds:
            return
        try:
            replies = await self.redis.execute_many(cmds, timeout)
        except Unavailable as e:
            raise Unavailable("storing big inputs in Redis: %s" % e.message)
        for r in replies:
            if isinstance(r, _resp.ReplyError):
                raise Unavailable("storing big inputs in Redis: %s" % r)

    def delete_unsent(self, preps):
        """Deletes the stored inputs of jobs whose SUBMIT never reached the broker (not sent, or
        their inputs' write failed) -- those whose id this client made. A caller's id may be a
        pending job's, submitted before (a retry): the keys are then that job's, and expire."""
        self.delete([p for p in preps if p.own_id])

    def delete(self, preps):
        """Deletes these jobs' stored inputs in the background (a task on the loop)."""
        keys = _keys(preps)
        if keys:
            self.loop.create_task(self._delete(keys))

    async def _delete(self, keys):
        # A second try on a new connection when the first found the open one broken: Redis may
        # have closed it (as it does after a protocol error) before the client saw.
        for _ in range(2):
            try:
                await self.redis.execute("DEL", *keys)
                return
            except Unavailable:
                continue
            except Exception:
                return  # they expire (input_ttl_s)

    async def delete_unsent_at_close(self, preps):
        """As delete_unsent, awaited, when the client closes: on the connection Redis has open
        (none is opened for it) and within min(request timeout, 1 s); else they expire."""
        keys = _keys([p for p in preps if p.own_id])
        if keys and self.redis.connected():
            try:
                await asyncio.wait_for(self.redis.execute("DEL", *keys), min(self.timeout, 1.0))
            except Exception:
                pass


def _keys(preps):
    return [key for p in preps if p.stored for key, _ in p.stored]
