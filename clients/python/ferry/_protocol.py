"""The wire contract's client side (docs/protocol.md): ids, jobs, result records, options."""

import os
import re
import urllib.parse
import uuid

import msgpack

from . import _record, _tensor
from ._errors import FerryError, InvalidArgument, TooLarge, error_for

TAG = b"FERRY1"
MAX_MODEL_NAME = 128
MAX_INPUTS = 64
MAX_MESSAGE_BYTES = 32 << 20  # tensor data per SUBMIT message, as the C++ SDK
# The broker's default --max-message-bytes (Options.max_message_bytes): a frame over the
# broker's limit makes it drop the connection without an answer.
DEFAULT_MAX_MESSAGE_BYTES = (64 << 20) + (1 << 20)
# A stored input is one Redis value: Redis refuses one over 512 MiB (proto-max-bulk-len).
MAX_STORED_BYTES = (512 << 20) - (1 << 20)
MAX_JOBS_PER_MESSAGE = 10000  # jobs per SUBMIT message: the broker's --max-jobs-per-message
MIN_BROKER_MESSAGE_BYTES = 1024  # the broker's own minimum --max-message-bytes
INT64_MAX = (1 << 63) - 1

_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
_packb = msgpack.Packer(use_bin_type=True).pack


def valid_id(id):
    return type(id) is str and _ID.match(id) is not None


def check_id(id):
    if not valid_id(id):
        raise InvalidArgument("job id %r must be 1-128 characters of [A-Za-z0-9._:-]" % (id,))
    return id


def new_id():
    return str(uuid.uuid4())


class Result:
    """A job's final result, as stored in Redis under <prefix>result:<id>.

    status: "done", "failed", "cancelled" or "expired". outputs: the model's outputs as numpy
    arrays without the batch dim (empty unless done). error: (code, message), or None when done.
    model, worker ("" when the broker wrote it), batch_size (the batch it ran in), attempt (1 on
    the first run), timing (microsecond Unix timestamps: submitted, dispatched, received,
    compute_start, compute_end, finished; broker-written results only submitted and finished).
    output_dtypes: the protocol dtype of each output (bfloat16 outputs arrive as float32)."""

    __slots__ = ("id", "status", "outputs", "error", "model", "worker", "batch_size", "attempt",
                 "timing", "output_dtypes")

    @property
    def ok(self):
        return self.status == "done"

    def raise_for_status(self):
        """Returns self when done; raises the FerryError of its error code otherwise."""
        if self.status != "done":
            code, message = self.error or (self.status, "")
            raise error_for(code, message, self.id)
        return self

    def __repr__(self):
        shapes = ", ".join("%s%s" % (a.dtype, list(a.shape)) for a in self.outputs)
        err = "" if self.error is None else " error=%r" % (self.error,)
        return "Result(id=%r status=%r outputs=[%s]%s batch_size=%d worker=%r)" % (
            self.id, self.status, shapes, err, self.batch_size, self.worker)

    def __eq__(self, other):
        if not isinstance(other, Result):
            return NotImplemented
        return (self.id == other.id and self.status == other.status
                and self.error == other.error and len(self.outputs) == len(other.outputs)
                and all(a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
                        for a, b in zip(self.outputs, other.outputs)))

    __hash__ = None


_STATUSES = ("done", "failed", "cancelled", "expired")


def decode_result(record, id):
    """A Result from a result record's bytes; FerryError(malformed) when it is not one. A big
    record in a bytearray (a Redis reply, _resp) is consumed: the outputs are views of it."""
    try:
        if type(record) is bytearray and len(record) >= _record.MIN_BYTES:
            m = _record.unpack(record)
        else:
            m = msgpack.unpackb(record, raw=False)
        status = m["status"]
        if status not in _STATUSES:
            raise ValueError("unknown status %r" % (status,))
        r = Result()
        r.id = m.get("id", id)
        r.status = status
        outs = m.get("outputs") or ()
        r.outputs = [_tensor.decode(t) for t in outs]
        r.output_dtypes = [t["dtype"] for t in outs]
        err = m.get("error")
        r.error = (err.get("code", ""), err.get("message", "")) if err else None
        if r.error is None and status != "done":
            r.error = (status, "")
        r.model = m.get("model", "")
        r.worker = m.get("worker", "")
        r.batch_size = m.get("batch_size", 0)
        r.attempt = m.get("attempt", 0)
        r.timing = m.get("timing") or {}
        return r
    except (ValueError, KeyError, IndexError, TypeError, AttributeError,
            msgpack.UnpackException) as e:
        raise FerryError("result record for %r is not a Ferry result: %s" % (id, e),
                         code="malformed", id=id)


class Job:
    """One job for submit_many: Job(model, *inputs, id=None, priority=0, timeout_ms=0,
    result_ttl_s=0). A dict with the same keys (inputs as a list) works too."""

    __slots__ = ("model", "inputs", "id", "priority", "timeout_ms", "result_ttl_s")

    def __init__(self, model, *inputs, id=None, priority=0, timeout_ms=0, result_ttl_s=0):
        self.model = model
        self.inputs = inputs
        self.id = id
        self.priority = priority
        self.timeout_ms = timeout_ms
        self.result_ttl_s = result_ttl_s

    @classmethod
    def of(cls, j):
        if isinstance(j, Job):
            return j
        if isinstance(j, dict):
            extra = set(j) - set(cls.__slots__)
            if extra or "model" not in j:
                raise InvalidArgument("a job dict takes model, inputs, id, priority, timeout_ms, "
                                      "result_ttl_s (got %s)" % sorted(j))
            return cls(j["model"], *j.get("inputs", ()), id=j.get("id"),
                       priority=j.get("priority", 0), timeout_ms=j.get("timeout_ms", 0),
                       result_ttl_s=j.get("result_ttl_s", 0))
        raise InvalidArgument("a job is a ferry.Job or a dict, not %s" % type(j).__name__)


class Prepared:
    """A job checked and encoded for SUBMIT: `packed` is its msgpack map; `stored` the
    (key, bytes) of its inputs that go to Redis first (the claim check); `frames` the bytes of
    its attached inputs, in input order, sent as data frames after the SUBMIT body (memoryviews
    of the arrays where they are big: sent without a copy); `size` what it adds to a SUBMIT,
    body and frames. stored and frames are None when there are none. `own_id`: the client made
    the id (none was given), so no other job can have it."""

    __slots__ = ("id", "packed", "stored", "frames", "size", "own_id")


def _int(name, v, low=0):
    if type(v) is not int:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InvalidArgument("%s must be an integer, not %r" % (name, v))
        v = int(v)
    if v < low or v > INT64_MAX:
        raise InvalidArgument("%s must be %d..2^63-1 (got %d)" % (name, low, v))
    return v


def prepare(model, inputs, id, priority, timeout_ms, result_ttl_s, stored_bytes, prefix,
            attached_bytes=0, max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, max_job_bytes=0,
            own_id=False):
    """Checks one job and encodes it (InvalidArgument / TooLarge when it cannot be sent).
    Inputs of >= stored_bytes are stored, other inputs of >= attached_bytes attached (0: none
    of either), as the C++ SDK's ClientOptions::stored_input_bytes / attached_input_bytes; a
    job whose other inputs need more than max_message_bytes in its SUBMIT is TooLarge, and so
    is one with more than max_job_bytes of inputs in all (the broker's --max-job-bytes from
    LIMITS; 0: not known), before its stored inputs are written. An id of None is made here;
    `own_id` says the caller made `id` so (the job's Prepared.own_id is true either way)."""
    own_id = own_id or id is None
    id = new_id() if id is None else check_id(id)
    if type(model) is not str or not 0 < len(model) <= MAX_MODEL_NAME:
        raise InvalidArgument("model must be a string of 1-128 characters", id=id)
    if len(inputs) > MAX_INPUTS:
        raise InvalidArgument("a job takes at most 64 inputs", id=id)
    # Attached inputs as memoryviews from their threshold on: pyzmq then copies those under
    # its copy threshold once, into the frame, and sends the others from the array itself.
    view_bytes = min(attached_bytes, 65536) if attached_bytes else 65536
    try:
        encoded = []
        stored = frames = None
        attached = total = 0
        for i, x in enumerate(inputs):
            name, shape, data, nbytes = _tensor.encode(x, "input %d" % i, view_bytes)
            total += nbytes
            if stored_bytes and nbytes >= stored_bytes:
                if nbytes > MAX_STORED_BYTES:
                    raise TooLarge("input %d: %d bytes; a stored input is one Redis value, at "
                                   "most %d bytes" % (i, nbytes, MAX_STORED_BYTES))
                if stored is None:
                    stored = []
                stored.append(("%sinput:%s:%d" % (prefix, id, i), data))
                encoded.append({"dtype": name, "shape": shape, "stored": True})
            elif attached_bytes and nbytes >= attached_bytes:
                if frames is None:
                    frames = []
                frames.append(data)
                encoded.append({"dtype": name, "shape": shape, "attached": True})
                attached += nbytes
            else:
                encoded.append({"dtype": name, "shape": shape, "data": data})
        if max_job_bytes > 0 and total > max_job_bytes:
            raise TooLarge("job \"%s\" has %d bytes of inputs; the broker takes at most %d a "
                           "job (its --max-job-bytes): not sent" % (id, total, max_job_bytes))
        job = {"id": id, "model": model, "inputs": encoded}
        if priority:
            job["priority"] = _int("priority", priority, -INT64_MAX - 1)
        if timeout_ms:
            job["timeout_ms"] = _int("timeout_ms", timeout_ms)
        if result_ttl_s:
            job["result_ttl_s"] = _int("result_ttl_s", result_ttl_s)
    except FerryError as e:
        e.id = id
        raise
    p = Prepared()
    p.id = id
    p.own_id = own_id
    p.packed = _packb(job)
    # What the job adds to a SUBMIT's body and data frames, and whether one SUBMIT holds it.
    p.size = len(p.packed) + attached
    need = submit_header_bytes(prefix) + p.size
    if need > max_message_bytes:
        raise TooLarge("job \"%s\" needs up to %d bytes in its SUBMIT; the broker takes at most %d "
                       "(max_message_bytes, the broker's --max-message-bytes): store its big "
                       "inputs in Redis (stored_input_bytes) or raise both"
                       % (id, need, max_message_bytes), id=id)
    p.stored = stored
    p.frames = frames
    return p


def submit_header_bytes(prefix):
    """At least what a SUBMIT's body holds besides its jobs: "rid", "ack", "inline_results",
    "notify" (the prefix, "notify:" and a token), the jobs array's header."""
    return 1024 + len(prefix)


class Options:
    """The client's options (the C++ SDK's ClientOptions, same names and defaults)."""

    DEFAULTS = {
        "redis_prefix": "ferry:",
        "request_timeout_ms": 5000,
        "push_results": True,
        "stored_input_bytes": 64 * 1024,
        "attached_input_bytes": 16 * 1024,
        "max_message_bytes": DEFAULT_MAX_MESSAGE_BYTES,
        "input_ttl_s": 3600,
        "consume_results": False,
        "curve_server_public": None,
        "curve_secret": None,
        "redis_password_file": None,
        "redis_tls_ca": None,
        "redis_tls_cert": None,
        "redis_tls_key": None,
    }

    def __init__(self, frontend=None, redis=None, **options):
        unknown = set(options) - set(self.DEFAULTS)
        if unknown:
            raise TypeError("unknown ferry client option(s): %s (known: %s)"
                            % (", ".join(sorted(unknown)), ", ".join(sorted(self.DEFAULTS))))
        self.frontend = frontend or os.environ.get("FERRY_FRONTEND") or "tcp://127.0.0.1:5555"
        self.redis = redis or os.environ.get("FERRY_REDIS") or "redis://127.0.0.1:6379"
        for k, v in self.DEFAULTS.items():
            setattr(self, k, options.get(k, v))
        self._env_defaults(options)
        self.request_timeout_ms = _int("request_timeout_ms", self.request_timeout_ms, 1)
        self.stored_input_bytes = _int("stored_input_bytes", self.stored_input_bytes)
        self.attached_input_bytes = _int("attached_input_bytes", self.attached_input_bytes)
        self.max_message_bytes = _int("max_message_bytes", self.max_message_bytes, 1024)
        self.input_ttl_s = _int("input_ttl_s", self.input_ttl_s, 1)
        if self.input_ttl_s > 30 * 24 * 3600:
            raise InvalidArgument("input_ttl_s must be 1 s to 30 days")
        if type(self.redis_prefix) is not str or not self.redis_prefix:
            raise InvalidArgument("redis_prefix must be a non-empty string")
        if bool(self.curve_server_public) != bool(self.curve_secret):
            raise InvalidArgument("curve_server_public (the broker's NAME.key) and curve_secret "
                                  "(this client's NAME.key_secret) go together (in the "
                                  "environment: FERRY_CURVE_SERVER_PUBLIC, FERRY_CURVE_SECRET)")

    # Options whose default comes from the environment (`ferry up --env-file` writes them).
    ENV = {
        "redis_prefix": "FERRY_REDIS_PREFIX",
        "curve_server_public": "FERRY_CURVE_SERVER_PUBLIC",
        "curve_secret": "FERRY_CURVE_SECRET",
        "redis_password_file": "FERRY_REDIS_PASSWORD_FILE",
        "redis_tls_ca": "FERRY_REDIS_TLS_CA",
        "redis_tls_cert": "FERRY_REDIS_TLS_CERT",
        "redis_tls_key": "FERRY_REDIS_TLS_KEY",
        "max_message_bytes": "FERRY_MAX_MESSAGE_BYTES",
    }

    def _env_defaults(self, options):
        """An option not given as an argument takes its FERRY_* variable (a given None or ""
        means "none": it does not). Redis ones apply only where they can: the TLS files to a
        rediss:// URL, the password file to a URL without a password, so that a plain URL
        passed in code still works in a shell that sourced a TLS fleet's env file."""
        env = {k: os.environ.get(v) or None for k, v in self.ENV.items() if k not in options}
        try:
            u = urllib.parse.urlsplit(self.redis)
            tls, has_password = u.scheme == "rediss", u.password is not None
        except ValueError:  # parse_redis_url says what is wrong with it
            tls, has_password = False, False
        if not tls:
            for k in ("redis_tls_ca", "redis_tls_cert", "redis_tls_key"):
                env.pop(k, None)
        if has_password:
            env.pop("redis_password_file", None)
        limit = env.get("max_message_bytes")
        if limit is not None and limit.strip().isdigit():
            env["max_message_bytes"] = int(limit)  # else _int says it is not an integer
        for k, v in env.items():
            if v is not None:
                setattr(self, k, v)


def decode_limits(command, body):
    """(max_message_bytes, max_jobs_per_message, max_job_bytes) of a LIMITS answer, or None
    where it is not one (an ERROR, or a body that cannot be read): the C++ SDK's
    protocol::DecodeLimits."""
    if command != "LIMITS":
        return None
    got = []
    for key in ("max_message_bytes", "max_job_bytes", "max_jobs_per_message"):
        v = body.get(key)
        if v is not None and type(v) is not int:
            return None
        got.append(v or 0)
    if got[0] < MIN_BROKER_MESSAGE_BYTES or got[2] < 1:
        return None
    return got[0], got[2], got[1]


def too_large_message(nbytes, limit, command="SUBMIT"):
    """The C++ SDK's word for a message over the broker's limit, refused before it is sent."""
    message = ("a %s of %d bytes is over the broker's limit of %d bytes a message (its "
               "--max-message-bytes; set max_message_bytes to it): not sent, as the broker "
               "would drop the connection without an answer" % (command, nbytes, limit))
    if command == "SUBMIT":
        message += ("; store big inputs in Redis (stored_input_bytes) or submit fewer jobs at "
                    "once")
    return message
