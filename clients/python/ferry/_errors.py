"""Ferry's errors: one class per status code a caller handles differently.

Every error carries the protocol's snake_case ``code`` and a human ``message``; ``id`` is the
job id it concerns, when there is one (so that a retryable rejection can be resubmitted with the
same id).
"""

__all__ = [
    "FerryError", "QueueFull", "Unavailable", "UnknownModel", "InvalidArgument", "TooLarge",
    "Timeout", "Duplicate", "error_for",
]


class FerryError(Exception):
    """A Ferry status that is not ok: ``code`` (e.g. ``"queue_full"``), ``message``, ``id``."""

    code = "internal"
    #: Whether submitting again with the same id (after a back-off) may succeed.
    retryable = False

    def __init__(self, message="", code=None, id=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.id = id

    def __str__(self):
        where = " (job %s)" % self.id if self.id else ""
        return "%s: %s%s" % (self.code, self.message, where)

    def __repr__(self):
        return "%s(code=%r, message=%r, id=%r)" % (type(self).__name__, self.code, self.message,
                                                   self.id)

    def __reduce__(self):  # picklable (multiprocessing, Celery-style result passing)
        return (error_for, (self.code, self.message, self.id))


class QueueFull(FerryError):
    """The model's queue (or the broker's pending bytes) is full: back off, resubmit same id."""
    code = "queue_full"
    retryable = True


class Unavailable(FerryError):
    """The broker or Redis did not answer, or could not keep the job: back off, resubmit the
    same id (a job the broker already holds is then rejected as duplicate, nothing runs twice)."""
    code = "unavailable"
    retryable = True


class UnknownModel(FerryError):
    """No worker has announced this model since the broker started."""
    code = "unknown_model"


class InvalidArgument(FerryError):
    """The request is wrong: a bad id, option or tensor (also a dtype numpy cannot send)."""
    code = "invalid_argument"


class TooLarge(FerryError):
    """The job's inputs exceed the broker's --max-job-bytes (or one tensor is over 2 GiB)."""
    code = "too_large"


class Duplicate(FerryError):
    """A job with this id is still pending at the broker (submit only; run waits for it)."""
    code = "duplicate"


class Timeout(FerryError, TimeoutError):
    """No result within the caller's timeout. The job may still finish: wait again by id."""
    code = "timeout"


_BY_CODE = {c.code: c for c in (QueueFull, Unavailable, UnknownModel, InvalidArgument, TooLarge,
                                Duplicate, Timeout)}


def error_for(code, message="", id=None):
    """The FerryError (subclass, where the code has one) for a protocol status code."""
    cls = _BY_CODE.get(code, FerryError)
    return cls(message, code=code, id=id)
