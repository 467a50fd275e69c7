"""What the engine keeps per request in flight: run() jobs, submit() calls, and the handler of
each reply (matched by rid)."""

from ._errors import FerryError, error_for


def unnamed_error(code, message, id):
    """The error of job `id` where the broker's answer did not name it: a SUBMIT refused whole
    (ERROR: the broker read none of its jobs), an answer that is no answer, a job an ACCEPTED
    left out. It carries the id for the caller (to resubmit with), and owns_inputs() reads it as
    saying nothing of the job: a caller's id may be a pending job's, whose inputs its keys are."""
    err = error_for(code, message, id)
    err.unnamed = True
    return err


class RunJob:
    """One run() submission: queued -> sent (ack false: a reply comes only for a rejection)."""

    __slots__ = ("prep", "sent", "ever_sent", "sends", "cancelled", "error", "sent_at", "queued",
                 "rid")

    def __init__(self, prep):
        self.prep = prep
        self.rid = None  # the rid of the last SUBMIT that carried it: only its rejection counts
        self.sent = False
        self.ever_sent = False
        self.sends = 0  # SUBMITs that carried it
        self.cancelled = False
        self.error = None
        self.sent_at = 0.0
        self.queued = False


class SubmitCall:
    """One submit()/submit_many() call: its jobs' verdicts (None = accepted) by id, and the ids
    of its jobs in a SUBMIT the socket took (`sent`)."""

    __slots__ = ("preps", "verdicts", "left", "future", "sent")

    def __init__(self, preps, future):
        self.preps = preps
        self.verdicts = {}
        self.left = len(preps)
        self.future = future
        self.sent = set()

    def settle(self, id, verdict):
        if id in self.verdicts or self.future.done():
            return
        self.verdicts[id] = verdict
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.verdicts)


class RunBatch:
    """Reply handler of one ack:false SUBMIT: only rejections come back. A job sent again since
    (a run resubmits after request_timeout_ms of silence) is judged by its latest SUBMIT alone: a
    late rejection of this one must not fail a job the later one may have had accepted."""

    __slots__ = ("jobs", "engine", "rid")

    def __init__(self, engine, jobs, rid):
        self.engine = engine
        self.jobs = jobs
        self.rid = rid

    def alive(self):
        """Whether a job of this SUBMIT still waits on its reply: not returned (run() marks its
        job cancelled then) nor sent again since (its later SUBMIT's handler judges it)."""
        return any(not j.cancelled and j.rid == self.rid for j in self.jobs)

    def reply(self, command, body):
        jobs = [j for j in self.jobs if j.rid == self.rid]
        if command == "ERROR":  # each job's own error, with its id (a retry needs it)
            for j in jobs:
                self.engine.reject(j, unnamed_error(body.get("code", "internal"),
                                                    body.get("message", ""), j.prep.id))
            return
        if command != "ACCEPTED":
            for j in jobs:
                self.engine.reject(j, unnamed_error(
                    "malformed", "broker answered %s to SUBMIT" % command, j.prep.id))
            return
        by_id = {j.prep.id: j for j in jobs}
        for r in body.get("rejected") or ():
            j = by_id.get(r.get("id"))
            if j is None and len(self.jobs) == 1 and jobs:
                j = jobs[0]  # a rejection without a readable id: the only job's
            if j is None or r.get("code") == "duplicate":
                continue  # duplicate: a job with this id is pending; its result is ours
            self.engine.reject(j, error_for(r.get("code", "internal"), r.get("message", ""),
                                             j.prep.id))


class SubmitBatch:
    """Reply handler of one SUBMIT of submit() calls: `items` its (Prepared, SubmitCall) pairs,
    `calls` those calls, `ids` its job ids."""

    __slots__ = ("calls", "ids", "items")

    def __init__(self, calls, ids, items=()):
        self.calls = calls
        self.ids = ids
        self.items = items

    def alive(self):
        return any(not c.future.done() for c in self.calls)

    def mark_sent(self):
        """The socket took this SUBMIT: its jobs are sent."""
        for p, c in self.items:
            c.sent.add(p.id)

    def fail(self, error):
        """Ends every call still waiting with error() (the client closed)."""
        for c in self.calls:
            if not c.future.done():
                c.future.set_exception(error())

    def reply(self, command, body):
        # Each job's verdict is its own error, with its id (a retry needs it).
        if command == "ACCEPTED":
            verdicts = dict.fromkeys(body.get("ids") or ())
            for r in body.get("rejected") or ():
                verdicts[r.get("id")] = error_for(r.get("code", "internal"),
                                                  r.get("message", ""), r.get("id"))
            missing = ("internal", "the broker did not report on this job")
        elif command == "ERROR":
            verdicts = {}
            missing = (body.get("code", "internal"), body.get("message", ""))
        else:
            verdicts = {}
            missing = ("malformed", "broker answered %s to SUBMIT" % command)
        for c in self.calls:
            for p in c.preps:
                if p.id in self.ids:
                    v = verdicts[p.id] if p.id in verdicts else unnamed_error(*missing, p.id)
                    c.settle(p.id, v)


class Request:
    __slots__ = ("future", "expected")

    def __init__(self, future, expected):
        self.future = future
        self.expected = expected

    def alive(self):
        return not self.future.done()

    def reply(self, command, body):
        if self.future.done():
            return
        if command == "ERROR":
            self.future.set_exception(error_for(body.get("code", "internal"),
                                                body.get("message", "")))
        elif command != self.expected:
            self.future.set_exception(FerryError(
                "broker answered %s where %s was expected" % (command, self.expected),
                code="malformed"))
        else:
            self.future.set_result(body)
