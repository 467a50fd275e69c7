"""The client against a secured fleet (docs/security.md): CURVE on the broker's sockets with
allow-lists, a Redis that requires a password and speaks TLS only. One fleet with all three on,
as a deployment runs it; each negative case changes one thing."""

import asyncio
import os
import shutil
import threading
import uuid

import numpy as np
import pytest

import ferry
from conftest import assert_tiny
from fleet import Fleet

PASSWORD = "pw-" + uuid.uuid4().hex  # no secret on a command line: the fleet reads a file

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs the openssl CLI (scripts/install-deps.sh)")


def uid(tag):
    return "py-sec-%s-%s" % (tag, uuid.uuid4().hex[:12])


@pytest.fixture(scope="module")
def secure(models_dir):
    f = Fleet(models_dir, models=("tiny",), curve=True, redis_password=PASSWORD,
              redis_tls=True, worker_args=["--max-batch", "64", "--threads", "1"])
    yield f
    f.stop()


def url(fleet, userinfo=""):
    return "rediss://%s127.0.0.1:%d" % (userinfo, fleet.redis_port)


def x8(seed):
    return np.random.default_rng(seed).uniform(-1, 1, 8).astype(np.float32)


def run_bounded(fn, limit=120):
    """fn() in a thread: (its exception or value). A hang guard, not a timing check: the
    calls here must end on their own, long before `limit` seconds."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: B902 (handed to the test)
            out["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), "the call hung"
    return out.get("error"), out.get("value")


def test_listed_keys_run_jobs_over_curve_with_results_read_over_tls(secure):
    opts = secure.client_options()  # CURVE keys, password file, CA
    with ferry.Client(secure.frontend, url(secure), **opts) as c:
        for seed in range(3):
            x = x8(seed)
            assert_tiny(c.run("tiny", x, timeout=60), x)
        xs = [x8(10 + i) for i in range(8)]
        ids = c.submit_many([ferry.Job("tiny", x) for x in xs])
        for i, x in zip(ids, xs):
            assert_tiny(c.wait(i, timeout=60), x)
            assert_tiny(c.poll(i), x)  # a Redis GET: over TLS, authenticated
        assert len(c.stats()["workers"]) == 1
    # Stored inputs (the claim check): the client SETs them over TLS, the worker reads them.
    with ferry.Client(secure.frontend, url(secure), stored_input_bytes=16, **opts) as c:
        x = x8(5)
        assert_tiny(c.run("tiny", x, timeout=60), x)

    async def main():
        async with ferry.AsyncClient(secure.frontend, url(secure), **opts) as c:
            xs = [x8(100 + i) for i in range(200)]
            rs = await asyncio.gather(*(c.run("tiny", x, timeout=60) for x in xs))
            for r, x in zip(rs, xs):
                assert_tiny(r, x)
            # Light load: the client subscribes (in the background) to its notify channel,
            # over the same TLS + AUTH path, and workers publish its notices there.
            engine = c._engine
            pushed = []
            on_push = engine.results._on_push
            engine.results._on_push = lambda payload: (pushed.append(payload), on_push(payload))
            for _ in range(500):
                assert_tiny(await c.run("tiny", xs[0], timeout=60), xs[0])
                if pushed:
                    break
                await asyncio.sleep(0.01)
            assert pushed, engine.last_error
    asyncio.run(main())


def test_the_environment_gives_every_security_option(secure, monkeypatch):
    """FERRY_* variables (what `ferry up --env-file` writes) are the options' defaults."""
    o = secure.client_options()
    monkeypatch.setenv("FERRY_FRONTEND", secure.frontend)
    monkeypatch.setenv("FERRY_REDIS", url(secure))
    monkeypatch.setenv("FERRY_CURVE_SERVER_PUBLIC", o["curve_server_public"])
    monkeypatch.setenv("FERRY_CURVE_SECRET", o["curve_secret"])
    monkeypatch.setenv("FERRY_REDIS_PASSWORD_FILE", o["redis_password_file"])
    monkeypatch.setenv("FERRY_REDIS_TLS_CA", o["redis_tls_ca"])
    monkeypatch.setenv("FERRY_REDIS_TLS_CERT", os.path.join(secure.tls, "client.crt"))
    monkeypatch.setenv("FERRY_REDIS_TLS_KEY", os.path.join(secure.tls, "client.key"))
    monkeypatch.setenv("FERRY_REDIS_PREFIX", "ferry:")
    with ferry.Client() as c:
        assert c.options.curve_secret == o["curve_secret"]
        assert c.options.redis_tls_cert.endswith("client.crt")
        x = x8(7)
        r = c.run("tiny", x, timeout=60)
        assert_tiny(r, x)
        assert_tiny(c.poll(r.id), x)
    # An argument wins; None means "none", not "the environment's".
    with ferry.Client(curve_server_public=None, curve_secret=None,
                      request_timeout_ms=500) as c:
        assert c.options.curve_server_public is None
        with pytest.raises(ferry.Unavailable) as e:
            c.stats()
        assert "CURVE" in str(e.value)
    # The Redis ones apply only where they can: TLS files to rediss://, the password file to
    # a URL without a password.
    o2 = ferry.AsyncClient(redis="redis://:x@127.0.0.1:1").options
    assert (o2.redis_tls_ca, o2.redis_password_file) == (None, None)
    monkeypatch.delenv("FERRY_CURVE_SECRET")
    with pytest.raises(ferry.InvalidArgument) as e:
        ferry.Client()
    assert "FERRY_CURVE_SECRET" in str(e.value)


@pytest.mark.parametrize("case", ["unlisted_key", "wrong_server_key", "no_curve"])
def test_a_refused_handshake_is_a_clear_unavailable_naming_curve(secure, case):
    o = secure.client_options()
    if case == "unlisted_key":  # a key pair the broker's allow-list does not hold
        o["curve_secret"] = secure.key("stranger", secret=True)
        said = "refused this client's CURVE key"
    elif case == "wrong_server_key":  # another key than the broker's
        o["curve_server_public"] = secure.key("worker")
        said = "CURVE handshake with the broker failed"
    else:
        del o["curve_server_public"], o["curve_secret"]
        said = "CURVE"  # "the broker requires CURVE" (or, when the broker hung up before
        # saying why, "a broker with CURVE on needs curve_server_public and curve_secret")
    with ferry.Client(secure.frontend, url(secure), request_timeout_ms=1000, **o) as c:
        with pytest.raises(ferry.Unavailable) as e:
            c.stats()
        assert said in str(e.value)
        with pytest.raises(ferry.Unavailable) as e:
            c.submit("tiny", x8(1))
        assert said in str(e.value)
        # run without a deadline: said too, once request_timeout_ms passed, not a hang.
        jid = uid(case)
        err, _ = run_bounded(lambda: c.run("tiny", x8(2), id=jid, timeout=None))
        assert isinstance(err, ferry.Unavailable), err
        assert said in str(err) and "not sent" in str(err) and err.retryable
        assert err.id == jid
    # Nothing of it was queued or ran.
    with ferry.Client(secure.frontend, url(secure), **secure.client_options()) as good:
        assert good.poll(jid) is None
        assert good.cancel(jid).not_found == [jid]


def test_redis_password_by_url_by_file_and_wrong(secure):
    o = secure.client_options()
    pw_file = o.pop("redis_password_file")
    x = x8(3)
    for redis_url, extra in [
            (url(secure, ":%s@" % PASSWORD), {}),           # in the URL
            (url(secure, "default:%s@" % PASSWORD), {}),    # ACL user "default" + password
            (url(secure), {"redis_password_file": pw_file})]:
        with ferry.Client(secure.frontend, redis_url, **o, **extra) as c:
            r = c.run("tiny", x, timeout=60)
            assert_tiny(r, x)
            assert_tiny(c.poll(r.id), x)
            assert_tiny(c.wait(r.id, timeout=5), x)
    for redis_url, said in [(url(secure, ":wrong-password@"), "WRONGPASS"),
                            (url(secure), "NOAUTH")]:
        with ferry.Client(secure.frontend, redis_url, request_timeout_ms=1000, **o) as c:
            with pytest.raises(ferry.Unavailable) as e:
                c.poll(uid("pw"))
            assert said in str(e.value)
            assert "wrong-password" not in str(e.value)
            with pytest.raises(ferry.Unavailable) as e:  # wait: until its deadline, then says
                c.wait(uid("pw"), timeout=0.5)
            assert said in str(e.value)
    with pytest.raises(ferry.InvalidArgument):  # twice: in the URL and in a file
        ferry.Client(secure.frontend, url(secure, ":x@"), redis_password_file=pw_file)


def test_redis_tls_needs_the_ca_and_tls(secure):
    o = secure.client_options()
    x = x8(4)
    ca = o.pop("redis_tls_ca")
    # With a client certificate as well (the server takes one: tls-auth-clients optional).
    with ferry.Client(secure.frontend, url(secure), redis_tls_ca=ca,
                      redis_tls_cert=os.path.join(secure.tls, "client.crt"),
                      redis_tls_key=os.path.join(secure.tls, "client.key"), **o) as c:
        r = c.run("tiny", x, timeout=60)
        assert_tiny(c.poll(r.id), x)
    # Without the test CA: the system's CAs do not know the server's certificate.
    with ferry.Client(secure.frontend, url(secure), request_timeout_ms=1000, **o) as c:
        with pytest.raises(ferry.Unavailable) as e:
            c.poll(uid("tls"))
        assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    # Plain redis:// to the TLS port.
    plain = "redis://127.0.0.1:%d" % secure.redis_port
    with ferry.Client(secure.frontend, plain, request_timeout_ms=1000, **o) as c:
        with pytest.raises(ferry.Unavailable):
            c.poll(uid("tls"))
    with pytest.raises(ferry.InvalidArgument):
        ferry.Client(secure.frontend, plain, redis_tls_ca=ca, **o)  # TLS files need rediss://
