import contextlib
import os
import sys
import tempfile
import threading
import uuid

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if os.environ.get("FERRY_TEST_INSTALLED") != "1":  # else: the installed package
    sys.path.insert(0, os.path.dirname(HERE))

from fleet import Fleet, make_models  # noqa: E402

W = np.array([[0.01 * (i * 8 + j) - 0.3 for j in range(8)] for i in range(8)], np.float64)
B = np.array([0.1 * j for j in range(8)], np.float64)


def tiny_reference(x):
    """tiny.pt: y[j] = sum_i x[i] W[i][j] + b[j] (float64 here; the model computes float32)."""
    return np.asarray(x, np.float64) @ W + B


def assert_tiny(result, x):
    assert result.status == "done", result
    assert result.error is None
    assert len(result.outputs) == 1
    y = result.outputs[0]
    assert y.dtype == np.float32 and y.shape == (8,)
    np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="session")
def models_dir():
    d = tempfile.mkdtemp(prefix="ferry-py-models-")
    make_models(d, ["tiny", "multi", "null", "slow", "whisper"])
    yield d
    import shutil
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def fleet(models_dir):
    """The shared fleet: tiny, multi, null and slow on one CPU worker (max batch 64)."""
    f = Fleet(models_dir, models=("tiny", "multi", "null", "slow"),
              worker_args=["--max-batch", "64", "--threads", "1"])
    yield f
    f.stop()


def done_record(y, model, worker):
    """A done result record (msgpack) with the one float32 output `y`, as a worker writes it."""
    import msgpack
    return msgpack.packb({"status": "done", "model": model, "worker": worker, "batch_size": 1,
                          "attempt": 1, "timing": {},
                          "outputs": [{"dtype": "float32", "shape": list(y.shape),
                                       "data": y.tobytes()}]})


def uid(tag):
    return "py-%s-%s" % (tag, uuid.uuid4().hex[:12])


@pytest.fixture
def client(fleet):
    import ferry
    with ferry.Client(fleet.frontend, fleet.redis_url) as c:
        yield c


# The broker's defaults, as a stub broker answers LIMITS with them.
STUB_LIMITS = {"max_message_bytes": (64 << 20) + (1 << 20), "max_job_bytes": 64 << 20,
               "max_jobs_per_message": 10000}


def answered_limits(router, frames, **limits):
    """For a stub broker (a ROUTER): answers `frames` (as received) if they are the LIMITS a
    client sends first on each connection -- it sends nothing else until answered -- with the
    broker's defaults or `limits`; whether they were."""
    import msgpack
    if len(frames) < 4 or frames[2] != b"LIMITS":
        return False
    answer = dict(STUB_LIMITS, **limits)
    rid = msgpack.unpackb(frames[3]).get("rid") if frames[3] else None
    if rid is not None:
        answer["rid"] = rid
    router.send_multipart([frames[0], frames[1], b"LIMITS", msgpack.packb(answer)])
    return True


@contextlib.contextmanager
def stub_broker(handle, ctx=None, setup=None, limits=True):
    """A stub broker: a ROUTER on 127.0.0.1 that one thread serves, calling handle(router,
    frames) for each message it reads (frames as received: peer, tag, command, body, data).
    It answers a LIMITS itself unless `limits` is false. setup(router) runs before the bind
    (CURVE options); a `ctx` given is the caller's to end. Yields its frontend's address; on
    leaving, the thread stops and the socket closes, and what `handle` raised is raised."""
    import zmq
    own = ctx is None
    ctx = ctx or zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    if setup:
        setup(router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    failed = []  # what `handle` raised: raised again on leaving, so that the test fails

    def serve():
        try:
            while not stop.is_set():
                if not router.poll(20):
                    continue
                frames = router.recv_multipart()
                if not (limits and answered_limits(router, frames)):
                    handle(router, frames)
        except BaseException as e:  # noqa: B902 (raised again below)
            failed.append(e)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield "tcp://127.0.0.1:%d" % port
    finally:
        stop.set()
        t.join(10)
        alive = t.is_alive()
        if not alive:
            router.close(0)
            if own:
                ctx.term()
    if alive:
        raise AssertionError("the stub broker's thread did not stop")
    if failed:
        raise failed[0]


def spy_submits(engine):
    """Records each SUBMIT the engine sends: (its body, its data frames as sent)."""
    import msgpack
    sent = []
    send = engine._send

    def spy(command, body, frames=(), *rest):
        if command == b"SUBMIT":
            sent.append((msgpack.unpackb(body), list(frames)))
        return send(command, body, frames, *rest)
    engine._send = spy
    return sent
