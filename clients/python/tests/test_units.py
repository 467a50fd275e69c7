"""Checks that need no fleet: dtypes, records, options, errors."""

import msgpack
import numpy as np
import pytest

import ferry
from ferry import _protocol, _record, _resp, _tensor
from conftest import stub_broker


@pytest.mark.parametrize("name", sorted(ferry.DTYPES))
def test_every_dtype_round_trips_through_the_wire_form(name):
    rng = np.random.default_rng(3)
    if name == "bfloat16":
        x = ferry.bfloat16(np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, -7.0]], np.float32))
        dtype, shape, data, _ = _tensor.encode(x, "x")
        back = _tensor.decode({"dtype": dtype, "shape": shape, "data": data})
        assert back.dtype == np.float32  # bfloat16 comes back as float32, exactly
        np.testing.assert_array_equal(back, np.array([[1.0, -2.5, 3.140625],
                                                      [0.0, 0.0009994506835937, -7.0]],
                                                     np.float32))
        return
    np_dtype = ferry.DTYPES[name]
    if name == "bool":
        x = rng.integers(0, 2, (3, 4)).astype(bool)
    elif np_dtype.kind == "f":
        x = rng.standard_normal((3, 4)).astype(np_dtype)
    else:
        info = np.iinfo(np_dtype)
        x = rng.integers(info.min, info.max, (3, 4), endpoint=True).astype(np_dtype)
    dtype, shape, data, nbytes = _tensor.encode(x, "x")
    assert dtype == name and shape == [3, 4] and nbytes == x.nbytes
    wire = msgpack.unpackb(msgpack.packb({"dtype": dtype, "shape": shape, "data": data}))
    back = _tensor.decode(wire)
    assert back.dtype == x.dtype and back.shape == x.shape and back.flags.writeable
    np.testing.assert_array_equal(back, x)


def test_a_stored_input_too_big_for_one_redis_value_is_too_large():
    """Redis refuses a value over 512 MiB by dropping the connection: refused before sending."""
    x = np.zeros(_protocol.MAX_STORED_BYTES + 1, np.uint8)  # zero pages: never touched
    with pytest.raises(ferry.TooLarge) as e:
        _protocol.prepare("m", [x], None, 0, 0, 0, 65536, "ferry:")
    assert "one Redis value" in str(e.value)


def test_a_job_over_both_limits_is_refused_for_the_job_limit():
    """As the C++ SDK: storing its inputs (the message limit's advice) cannot help it."""
    x = np.ones(100000, np.float32)  # 400,000 bytes, inside the SUBMIT
    with pytest.raises(ferry.TooLarge) as e:
        _protocol.prepare("m", [x], "over-both", 0, 0, 0, 0, "ferry:",
                          max_message_bytes=64 << 10, max_job_bytes=200000)
    assert ('job "over-both" has 400000 bytes of inputs; the broker takes at most 200000 a job '
            '(its --max-job-bytes): not sent') in str(e.value)
    with pytest.raises(ferry.TooLarge) as e:  # the job limit not known yet
        _protocol.prepare("m", [x], "big-message", 0, 0, 0, 0, "ferry:",
                          max_message_bytes=64 << 10)
    assert 'job "big-message" needs up to' in str(e.value)
    assert "store its big inputs in Redis" in str(e.value)
    stored = _protocol.prepare("m", [x], "big-message", 0, 0, 0, 65536, "ferry:",
                               max_message_bytes=64 << 10)
    assert stored.stored and stored.stored[0][0] == "ferry:input:big-message:0"


def test_inputs_are_sent_little_endian_and_contiguous():
    x = np.arange(12, dtype=">i4").reshape(3, 4).T  # big-endian, not contiguous
    dtype, shape, data, _ = _tensor.encode(x, "x")
    assert (dtype, shape) == ("int32", [4, 3])
    assert bytes(data) == np.ascontiguousarray(x, "<i4").tobytes()
    dtype, shape, data, _ = _tensor.encode([[1.5, 2.5]], "x")  # lists: numpy.asarray
    assert (dtype, shape) == ("float64", [1, 2])
    assert _tensor.encode(np.float32(2.0), "x")[:2] == ("float32", [])  # a scalar


def test_dtypes_without_a_ferry_dtype_are_refused():
    for bad in (np.zeros(2, np.uint16), np.zeros(2, np.complex64), np.array(["a"])):
        with pytest.raises(ferry.InvalidArgument):
            _tensor.encode(bad, "x")


def test_bfloat16_rounds_to_nearest_even():
    bits = ferry.bfloat16(np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.nan], np.float32)).data
    assert np.frombuffer(bits, "<u2").tolist()[:2] == [0x3F80, 0x3F82]
    assert np.frombuffer(bits, "<u2")[2] == 0x7FC0


def test_tensor_and_bfloat16_keep_a_scalar_a_scalar():
    """ferry.Tensor(x, dtype) and ferry.bfloat16(x) of a scalar send shape [], as a plain numpy
    scalar does (np.ascontiguousarray made it [1]; bfloat16 of a scalar raised TypeError)."""
    for x in (np.float32(2.0), 2.0, np.array(2.0)):
        t = ferry.Tensor(x, "float32")
        assert (t.shape, t.data) == ([], np.float32(2.0).tobytes())
        b = ferry.bfloat16(x)
        assert (b.shape, b.data) == ([], b"\x00\x40")
        assert _tensor.encode(b, "x")[:2] == ("bfloat16", [])
    assert ferry.bfloat16(float("nan")).data == b"\xc0\x7f"
    assert ferry.Tensor(np.int16(5), "bfloat16").shape == []
    assert ferry.Tensor(np.asfortranarray(np.ones((2, 3), ">f8")), "float32").shape == [2, 3]


def test_a_bfloat16_output_of_any_shape_decodes_including_a_scalar():
    """A bf16 model that returns one value per job gives each job a shape-[] output: numpy made
    its `<< 16` an int64, and the float32 view of it failed (the result raised malformed)."""
    for shape, values in (([], [-2.5]), ([3], [1.0, 0.0, 7.0]), ([0], []), ([2, 2], [1, 2, 3, 4])):
        bits = ferry.bfloat16(np.array(values, np.float32).reshape(shape)).data
        for data in (bits, memoryview(bytearray(bits))):  # copied, or the record's own bytes
            back = _tensor.decode({"dtype": "bfloat16", "shape": shape, "data": data})
            assert back.dtype == np.float32 and list(back.shape) == shape and back.flags.writeable
            np.testing.assert_array_equal(back, np.array(values, np.float32).reshape(shape))


def record(**fields):
    base = {"id": "j1", "status": "done", "outputs": [], "model": "m", "worker": "w",
            "batch_size": 3, "attempt": 1, "timing": {"submitted": 1}}
    base.update(fields)
    return msgpack.packb(base)


def test_result_records_decode():
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = _protocol.decode_result(record(outputs=[
        {"dtype": "float32", "shape": [2, 3], "data": y.tobytes()}]), "j1")
    assert (r.id, r.status, r.error, r.model, r.worker, r.batch_size, r.attempt) == \
        ("j1", "done", None, "m", "w", 3, 1)
    np.testing.assert_array_equal(r.outputs[0], y)
    assert r.ok and r.raise_for_status() is r
    f = _protocol.decode_result(record(status="failed", error={"code": "model_error",
                                                                "message": "boom"}), "j1")
    assert f.error == ("model_error", "boom") and not f.ok
    with pytest.raises(ferry.FerryError) as e:
        f.raise_for_status()
    assert e.value.code == "model_error" and e.value.id == "j1"
    for bad in (b"\xc1", msgpack.packb([1]), record(status="weird"),
                record(outputs=[{"dtype": "float32", "shape": [2], "data": b"123"}])):
        with pytest.raises(ferry.FerryError) as e:
            _protocol.decode_result(bad, "j1")
        assert e.value.code == "malformed"


def _big_record(id, outputs, **extra):
    """A result record as bytes, its keys in an order the worker does not use, with odd-sized
    fields so that the data lands at every alignment."""
    return msgpack.packb({"timing": {"submitted": 1, "ms": 2.5, "neg": -70000}, "id": id,
                          "status": "done", "outputs": outputs, "model": "m", "worker": "w",
                          "batch_size": 2, "attempt": 1, **extra}, use_bin_type=True)


def test_big_records_decode_to_views_of_the_record_itself():
    """_record.unpack (a big record read into a bytearray by _resp) gives the same Result as
    msgpack, with each output a writable, aligned array over the record's own memory."""
    rng = np.random.default_rng(7)
    for pad in range(9):  # every data offset modulo 8
        ys = [rng.standard_normal((3, 40000)).astype(np.float32),
              rng.integers(-30000, 30000, 70001).astype(np.int16),
              rng.standard_normal(9000),                         # float64
              rng.integers(0, 255, 5).astype(np.uint8)]          # small: a bin8
        outs = [{"shape": list(y.shape), "dtype": _tensor._NAMES[y.dtype], "data": y.tobytes(),
                 "note": "x" * pad} for y in ys]
        raw = _big_record("j" * (pad + 1), outs,
                          extra={"k": [None, True, 1.5, b"\x00" * 300, "s" * 40, {"a": {"b": -1}}]})
        assert len(raw) >= _record.MIN_BYTES
        plain = _protocol.decode_result(raw, "j")          # bytes: msgpack, copies
        rec = bytearray(raw)
        fast = _protocol.decode_result(rec, "j")           # bytearray: views
        assert (fast.id, fast.status, fast.timing, fast.batch_size) == \
            (plain.id, plain.status, plain.timing, plain.batch_size)
        whole = np.frombuffer(rec, np.uint8)
        for y, a, b in zip(ys, fast.outputs, plain.outputs):
            np.testing.assert_array_equal(a, y)
            np.testing.assert_array_equal(b, y)
            assert a.dtype == y.dtype and a.shape == y.shape
            assert a.flags.writeable and a.flags.aligned
            assert np.shares_memory(a, whole), "an output was copied"
            assert not np.shares_memory(b, whole)
        a = fast.outputs[0]
        a[0, 0] = 123.0  # writable, and each output its own bytes
        np.testing.assert_array_equal(fast.outputs[1], ys[1])


def test_big_malformed_records_are_refused_as_msgpack_would():
    y = np.ones(30000, np.float32)
    good = _big_record("j1", [{"dtype": "float32", "shape": [30000], "data": y.tobytes()}])
    for bad in (good[:-1], good + b"\x00", good[:70000],
                _big_record("j1", [{"dtype": "float32", "shape": [2], "data": y.tobytes()}]),
                _big_record("j1", [{"dtype": "nope", "shape": [30000], "data": y.tobytes()}]),
                msgpack.packb([y.tobytes()]), b"\xc1" * 70000):
        for form in (bytes(bad), bytearray(bad)):
            with pytest.raises(ferry.FerryError) as e:
                _protocol.decode_result(form, "j1")
            assert e.value.code == "malformed"
    # Records msgpack reads differently from a walk -- a key twice (msgpack keeps the last),
    # nesting deeper than the walk's recursion -- go the plain way too: the same answer.
    P = msgpack.packb
    t = {"dtype": "float32", "shape": [30000], "data": y.tobytes()}
    two_outputs = b"\x82" + P("status") + P("done") + P("outputs") + P([t]) + P("outputs") + \
        P([dict(t, data=None)])
    two_data = P({"status": "done", "outputs": [t]})
    two_data = two_data[:-len(P("data")) - 5 - len(y.tobytes())] + P("data") + \
        P(y.tobytes()) + P("data") + P(None)
    two_data = two_data.replace(b"\x83", b"\x84", 1)  # the tensor map: 3 entries -> 4
    deep = P({"status": "done", "outputs": [t], "x": None})[:-1] + b"\x91" * 5000 + b"\xc0"
    for odd in (two_outputs, two_data, deep):
        with pytest.raises(ferry.FerryError) as plain:
            _protocol.decode_result(bytes(odd), "j1")
        with pytest.raises(ferry.FerryError) as fast:
            _protocol.decode_result(bytearray(odd), "j1")
        assert plain.value.code == fast.value.code == "malformed"
    # Outputs that are not tensor maps, and "data" that is not a bin, go the plain way.
    odd = _big_record("j1", [7, {"dtype": "float32", "shape": [1], "data": [1]}],
                      blob=b"z" * 70000)
    with pytest.raises(ferry.FerryError):
        _protocol.decode_result(bytearray(odd), "j1")


def test_errors_by_code():
    for code, cls in [("queue_full", ferry.QueueFull), ("unavailable", ferry.Unavailable),
                      ("unknown_model", ferry.UnknownModel), ("too_large", ferry.TooLarge),
                      ("invalid_argument", ferry.InvalidArgument), ("timeout", ferry.Timeout),
                      ("duplicate", ferry.Duplicate), ("malformed", ferry.FerryError)]:
        e = ferry.error_for(code, "msg", "id1")
        assert type(e) is cls and e.code == code and e.message == "msg" and e.id == "id1"
        assert e.retryable == (code in ("queue_full", "unavailable"))
    assert isinstance(ferry.Timeout("x"), TimeoutError)
    import pickle
    e = pickle.loads(pickle.dumps(ferry.QueueFull("full", id="a")))
    assert type(e) is ferry.QueueFull and e.id == "a"


def test_options_and_urls(tmp_path, monkeypatch):
    with pytest.raises(TypeError):
        ferry.AsyncClient(no_such_option=1)
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient(redis="http://x")
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient(redis="redis://h:1/notanumber")
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient(redis_tls_ca="/x")  # TLS files need rediss://
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient(curve_server_public="/x")  # and curve_secret
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient(request_timeout_ms=0)
    e = _resp.parse_redis_url("redis://user:p%40ss@host:7000/3")
    assert (e.host, e.port, e.db, e.username, e.password, e.ssl) == \
        ("host", 7000, 3, "user", "p@ss", None)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    e = _resp.parse_redis_url("rediss://host:7000", password_file=str(pw))
    assert e.password == "s3cret" and e.ssl is not None and e.port == 7000
    assert "p@ss" not in repr(_resp.parse_redis_url("redis://:p%40ss@h:1"))
    with pytest.raises(ferry.InvalidArgument) as bad:  # a '/' in the password: not parsed,
        _resp.parse_redis_url("redis://u:se/cret@h:1")  # and not shown
    assert "cret" not in str(bad.value), bad.value
    assert _resp._redact("unix:///tmp/x:y@z.sock") == "unix:///tmp/x:y@z.sock"
    assert _resp._redact("rediss://u:p@ss@h:1") == "rediss://u:***@h:1"
    # USER:PASSWORD with @HOST left out reads as HOST:PORT: a "port" that is not a number is
    # masked, in the message too; a real port, an IPv6 host, a socket path are shown.
    for url, secret in (("redis://u:SECRETPWC", "SECRETPWC"), ("redis://u:PW/SECRET", "SECRET"),
                        ("redis://u:PW?SECRET", "SECRET"), ("redis://u:99999", "99999")):
        with pytest.raises(ferry.InvalidArgument) as bad:
            _resp.parse_redis_url(url)
        assert secret not in str(bad.value) and "'redis://u:***'" in str(bad.value), bad.value
    for shown in ("redis://h:6379", "redis://[::1]:6379/0", "unix:///tmp/a:b.sock", "redis://h"):
        assert _resp._redact(shown) == shown
    with pytest.raises(ferry.InvalidArgument):  # the password twice
        _resp.parse_redis_url("redis://:x@h:1", password_file=str(pw))
    with pytest.raises(ferry.InvalidArgument):
        _resp.parse_redis_url("redis://h:1?db=2")
    # unix:///path[?db=N]: Redis's Unix-domain socket (as redis-py and the C++ side take it)
    e = _resp.parse_redis_url("unix://user:s3cret@/run/redis/redis.sock?db=2")
    assert (e.path, e.db, e.username, e.password, e.ssl) == \
        ("/run/redis/redis.sock", 2, "user", "s3cret", None)
    assert e.address == "unix:/run/redis/redis.sock" and "s3cret" not in repr(e)
    assert _resp.parse_redis_url("unix:///tmp/r.sock").db == 0
    e = _resp.parse_redis_url("unix://u:p%2Fw@/tmp/a@b.sock")  # as the C++ side splits it
    assert (e.path, e.password) == ("/tmp/a@b.sock", "p/w")
    for bad in ("unix://tmp/r.sock", "unix:///r.sock?database=1", "unix:///r.sock?db=x",
                "unix:///r.sock?", "unix:///r.sock?db=\u00b2", "unix:/tmp/r.sock",
                "unix:///" + "x" * 120):
        with pytest.raises(ferry.InvalidArgument):
            _resp.parse_redis_url(bad)
    with pytest.raises(ferry.InvalidArgument):  # no TLS over a local socket
        _resp.parse_redis_url("unix:///tmp/r.sock", tls_ca="/x")
    (tmp_path / "two").write_text("a\nb\n")
    with pytest.raises(ferry.InvalidArgument):
        _resp.parse_redis_url("redis://h:1", password_file=str(tmp_path / "two"))
    monkeypatch.setenv("FERRY_FRONTEND", "tcp://127.0.0.1:1")
    monkeypatch.setenv("FERRY_REDIS", "redis://127.0.0.1:2")
    c = ferry.AsyncClient()
    assert (c.options.frontend, c.options.redis) == ("tcp://127.0.0.1:1", "redis://127.0.0.1:2")
    c = ferry.AsyncClient("tcp://127.0.0.1:3")  # arguments win
    assert c.options.frontend == "tcp://127.0.0.1:3"
    monkeypatch.setenv("FERRY_REDIS_PREFIX", "other:")
    assert ferry.AsyncClient().options.redis_prefix == "other:"
    assert ferry.AsyncClient(redis_prefix="mine:").options.redis_prefix == "mine:"
    monkeypatch.setenv("FERRY_MAX_MESSAGE_BYTES", "2097152")
    assert ferry.AsyncClient().options.max_message_bytes == 2097152
    assert ferry.AsyncClient(max_message_bytes=4096).options.max_message_bytes == 4096
    monkeypatch.setenv("FERRY_MAX_MESSAGE_BYTES", "2MB")
    with pytest.raises(ferry.InvalidArgument):
        ferry.AsyncClient()


def test_curve_keys_from_zmq_certificates_against_a_curve_server(tmp_path):
    """CURVE with pyzmq's certificate files, against a stub broker (a CURVE ROUTER behind a
    ZAP handler that allows one client key) that answers STATS."""
    import zmq
    import zmq.auth
    from zmq.auth.thread import ThreadAuthenticator
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_secret = zmq.auth.create_certificates(str(keys), "server")
    client_pub, client_secret = zmq.auth.create_certificates(str(keys), "client")
    _, other_secret = zmq.auth.create_certificates(str(keys), "other")
    (allowed / "client.key").write_bytes(open(client_pub, "rb").read())

    def curve_server(router):
        router.curve_server = True
        router.curve_publickey, router.curve_secretkey = zmq.auth.load_certificate(server_secret)

    def answer_stats(router, message):
        peer, tag, command, body = message
        rid = msgpack.unpackb(body)["rid"]
        router.send_multipart([peer, tag, b"STATS", msgpack.packb({"workers": [], "rid": rid})])
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(allowed))
    try:
        with stub_broker(answer_stats, ctx=ctx, setup=curve_server) as endpoint:
            with ferry.Client(endpoint, curve_server_public=server_pub,
                              curve_secret=client_secret) as c:
                assert c.stats() == {"workers": []}
            for secret, server in ((other_secret, server_pub),      # a key the server refuses
                                   (client_secret, client_pub)):    # the wrong server key
                with ferry.Client(endpoint, curve_server_public=server, curve_secret=secret,
                                  request_timeout_ms=300) as c:
                    with pytest.raises(ferry.Unavailable) as e:
                        c.stats()
                    assert "CURVE" in str(e.value)
    finally:
        auth.stop()
        ctx.term()
    with pytest.raises(ferry.InvalidArgument):  # a public certificate where the secret goes
        ferry.Client(endpoint, curve_server_public=server_pub, curve_secret=server_pub)


def test_bad_jobs_fail_before_anything_is_sent():
    c = ferry.AsyncClient("tcp://127.0.0.1:9")
    prep = c._prepare
    with pytest.raises(ferry.InvalidArgument):
        prep("tiny", (np.zeros(8, np.float32),), "bad id!", 0, 0, 0)
    with pytest.raises(ferry.InvalidArgument):
        prep("", (), None, 0, 0, 0)
    with pytest.raises(ferry.InvalidArgument):
        prep("tiny", (), None, 0, -1, 0)
    with pytest.raises(ferry.InvalidArgument):
        prep("tiny", [np.zeros(1)] * 65, None, 0, 0, 0)
    p = prep("tiny", (np.zeros(20000, np.float32), np.zeros(8, np.float32)), "j", 5, 10, 20)
    job = msgpack.unpackb(p.packed)
    assert job["inputs"][0] == {"dtype": "float32", "shape": [20000], "stored": True}
    assert job["inputs"][1]["data"] == bytes(32)
    assert (job["priority"], job["timeout_ms"], job["result_ttl_s"]) == (5, 10, 20)
    assert [k for k, _ in p.stored] == ["ferry:input:j:0"]
    assert p.frames is None


def test_inputs_between_the_thresholds_are_attached():
    """Inputs not stored with >= attached_input_bytes (16 KiB) go in data frames after the
    body: the body names them {"dtype", "shape", "attached": true}; the frames are the bytes,
    in input order, views of the arrays (no copy) where they already are C-contiguous."""
    c = ferry.AsyncClient("tcp://127.0.0.1:9")
    assert c.options.attached_input_bytes == 16384
    small = np.zeros(8, np.float32)
    a = np.arange(4096, dtype=np.float32)                  # 16,384 bytes: attached
    b = np.arange(20000, dtype=np.int16)[::-1]             # 40,000, not contiguous: a copy
    big = np.arange(20000, dtype=np.float32)               # 80,000: stored
    p = c._prepare("m", (small, a, big, b), "j", 0, 0, 0)
    job = msgpack.unpackb(p.packed)
    assert job["inputs"][0]["data"] == bytes(32)
    assert job["inputs"][1] == {"dtype": "float32", "shape": [4096], "attached": True}
    assert job["inputs"][2] == {"dtype": "float32", "shape": [20000], "stored": True}
    assert job["inputs"][3] == {"dtype": "int16", "shape": [20000], "attached": True}
    assert [bytes(f) for f in p.frames] == [a.tobytes(), b.tobytes()]
    assert isinstance(p.frames[0], memoryview)
    assert np.shares_memory(np.frombuffer(p.frames[0], np.uint8), a)  # sent from a itself
    assert p.size >= a.nbytes + b.nbytes and p.size < a.nbytes + b.nbytes + big.nbytes
    just_under = c._prepare("m", (np.zeros(4095, np.float32),), "j", 0, 0, 0)
    assert "data" in msgpack.unpackb(just_under.packed)["inputs"][0]
    assert just_under.frames is None
    # attached_input_bytes=0: never; stored_input_bytes=0: what would be stored is attached.
    p = ferry.AsyncClient("tcp://127.0.0.1:9", attached_input_bytes=0)._prepare(
        "m", (a, big), "j", 0, 0, 0)
    assert p.frames is None and "data" in msgpack.unpackb(p.packed)["inputs"][0]
    p = ferry.AsyncClient("tcp://127.0.0.1:9", stored_input_bytes=0)._prepare(
        "m", (a, big), "j", 0, 0, 0)
    assert [bytes(f) for f in p.frames] == [a.tobytes(), big.tobytes()] and p.stored is None
    # A ferry.Tensor's bytes are attached as they are.
    t = ferry.Tensor(a, "float16")
    p = ferry.AsyncClient("tcp://127.0.0.1:9", attached_input_bytes=100)._prepare(
        "m", (t,), "j", 0, 0, 0)
    assert p.frames == [t.data]
    for bad in (-1, 1.5, "16", True):
        with pytest.raises(ferry.InvalidArgument):
            ferry.AsyncClient("tcp://127.0.0.1:9", attached_input_bytes=bad)
        with pytest.raises(ferry.InvalidArgument):
            ferry.Client("tcp://127.0.0.1:9", attached_input_bytes=bad)
    assert ferry.AsyncClient(attached_input_bytes=np.int64(5)).options.attached_input_bytes == 5


def test_redis_acl_user_and_tls_with_client_certificates(tmp_path):
    """The client's Redis side on a real redis-server with TLS only (client certificates
    required) and an ACL user: rediss://user:password@, redis_password_file, redis_tls_ca,
    redis_tls_cert, redis_tls_key."""
    import asyncio
    import shutil
    import socket
    import subprocess
    from fleet import free_port, make_test_ca, redis_server, wait_for
    if shutil.which("openssl") is None or shutil.which(redis_server()) is None:
        pytest.skip("needs openssl and redis-server")
    make_test_ca(str(tmp_path))
    port = free_port()
    (tmp_path / "redis.conf").write_text(
        "port 0\ntls-port %d\nbind 127.0.0.1 127.0.0.2\nsave \"\"\ndir %s\n"
        "tls-cert-file server.crt\ntls-key-file server.key\ntls-ca-cert-file ca.crt\n"
        "tls-auth-clients yes\nuser default off\n"
        "user producer on >s3cret ~ferry:* &ferry:notify:* +@all\n" % (port, tmp_path))
    redis = subprocess.Popen([redis_server(), str(tmp_path / "redis.conf")], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "pw").write_text("s3cret\n")
    tls = {"redis_tls_ca": str(tmp_path / "ca.crt"),
           "redis_tls_cert": str(tmp_path / "client.crt"),
           "redis_tls_key": str(tmp_path / "client.key")}
    url = "rediss://producer:s3cret@127.0.0.1:%d" % port
    record = msgpack.packb({"id": "tls-1", "status": "done", "outputs": [], "model": "m",
                            "worker": "w", "batch_size": 1, "attempt": 1, "timing": {}})

    async def main():
        c = ferry.AsyncClient("tcp://127.0.0.1:9", url, request_timeout_ms=2000, **tls)
        engine = c._get_engine()
        await engine.redis.execute("SET", "ferry:result:tls-1", record)
        assert (await c.poll("tls-1")).status == "done"
        assert (await c.wait("tls-1", timeout=5)).worker == "w"
        # A big result over TLS: read into a buffer of its own (_resp), outputs views of it.
        y = np.arange(300001, dtype=np.float32)
        await engine.redis.execute("SET", "ferry:result:tls-big", msgpack.packb(
            {"id": "tls-big", "status": "done", "model": "m", "outputs": [
                {"dtype": "float32", "shape": [300001], "data": y.tobytes()}]}))
        big = (await c.poll("tls-big")).outputs[0]
        np.testing.assert_array_equal(big, y)
        assert big.flags.writeable
        assert await c.poll("tls-2") is None
        await c.close()
        c = ferry.AsyncClient("tcp://127.0.0.1:9", "rediss://producer@127.0.0.1:%d" % port,
                              redis_password_file=str(tmp_path / "pw"), **tls)
        assert (await c.poll("tls-1")).status == "done"
        await c.close()
        for bad_url, options, said in [
                ("rediss://producer:wrong@127.0.0.1:%d" % port, tls, "WRONGPASS"),
                (url, {"redis_tls_ca": tls["redis_tls_ca"]}, ""),           # no client cert
                ("redis://producer:s3cret@127.0.0.1:%d" % port, {}, ""),    # no TLS at all
                # The server's certificate names 127.0.0.1 (and localhost), not 127.0.0.2.
                ("rediss://producer:s3cret@127.0.0.2:%d" % port, tls, "mismatch")]:
            c = ferry.AsyncClient("tcp://127.0.0.1:9", bad_url, request_timeout_ms=1000,
                                  **options)
            with pytest.raises(ferry.Unavailable) as e:
                await c.poll("tls-1")
            assert said in str(e.value)
            await c.close()

    try:
        def listening():
            assert redis.poll() is None, "redis-server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(listening, 20, "redis-server with TLS")
        assert redis.poll() is None
        asyncio.run(main())
    finally:
        redis.kill()
        redis.wait()


def test_the_issue_27_contract_names_exist_exactly():
    """The public names and signatures the issue promised (what users write against); each
    is also exercised against a real fleet in the test_client*.py files."""
    import inspect
    P = inspect.Parameter
    for cls, is_async in ((ferry.Client, False), (ferry.AsyncClient, True)):
        init = inspect.signature(cls.__init__).parameters
        assert list(init) == ["self", "frontend", "redis", "options"]
        assert init["options"].kind is P.VAR_KEYWORD
        want = {
            "submit": ["self", "model", "*inputs", "id=None", "priority=0", "timeout_ms=0",
                       "result_ttl_s=0"],
            "submit_many": ["self", "jobs"],
            "wait": ["self", "id", "timeout=None"],
            "poll": ["self", "id"],
            "run": ["self", "model", "*inputs", "timeout=None", "**job_options"],
            "cancel": ["self", "*ids"],
            "stats": ["self"],
            "close": ["self"],
        }
        for name, params in want.items():
            fn = getattr(cls, name)
            assert [str(p) for p in inspect.signature(fn).parameters.values()] == params, name
            assert inspect.iscoroutinefunction(fn) is is_async, name
        if is_async:
            assert inspect.iscoroutinefunction(cls.__aenter__)
            assert inspect.iscoroutinefunction(cls.__aexit__)
        else:
            assert callable(cls.__enter__) and callable(cls.__exit__)
    for field in ("id", "status", "outputs", "error", "model", "worker", "batch_size",
                  "attempt", "timing"):
        assert field in ferry.Result.__slots__, field
    for cls, code, retryable in ((ferry.QueueFull, "queue_full", True),
                                 (ferry.Unavailable, "unavailable", True),
                                 (ferry.UnknownModel, "unknown_model", False),
                                 (ferry.InvalidArgument, "invalid_argument", False),
                                 (ferry.TooLarge, "too_large", False),
                                 (ferry.Timeout, "timeout", False)):
        e = cls("why")
        assert isinstance(e, ferry.FerryError)
        assert (e.code, e.message, e.retryable) == (code, "why", retryable)
        assert type(ferry.error_for(code, "m")) is cls


def test_the_queue_of_results_to_consume_is_capped():
    """Results got inline under consume_results wait to be GETDEL'ed: at most 100,000 (as the
    C++ SDK's ResultDeleter); beyond, they are dropped (they expire with their result_ttl_s)."""
    import asyncio
    from ferry import _results

    async def main():
        loop = asyncio.get_running_loop()

        class Stuck:  # a Redis that never answers
            async def execute_many(self, commands):
                await loop.create_future()

        res = _results.Results(_protocol.Options(), loop, Stuck(), None, 1.0, lambda: None,
                               lambda *a, **k: None)
        for k in range(100050):
            res._consume_later("job-%d" % k)
        assert len(res._to_consume) == 100000
        await asyncio.sleep(0)  # the deleter takes its first round trip's worth
        for k in range(10):
            res._consume_later("more-%d" % k)
        assert len(res._to_consume) < 100000
        res.close()
        res._consumer.cancel()
    asyncio.run(main())


def test_a_long_wait_does_not_keep_a_future_per_recheck(monkeypatch):
    """A waiter that re-checks Redis (no notice comes: an id submitted elsewhere, or a long job)
    sleeps on a new future each time; those the timer woke must not pile up on the entry."""
    import asyncio
    from ferry import _results
    monkeypatch.setattr(_results, "FIRST_RECHECK", 0.001)
    monkeypatch.setattr(_results, "MAX_RECHECK", 0.001)

    async def main():
        loop = asyncio.get_running_loop()
        reads = 0

        class NoResult:
            async def execute(self, *args, timeout=None):
                nonlocal reads
                reads += 1
                return None

        res = _results.Results(_protocol.Options(), loop, NoResult(), None, 1.0, lambda: None,
                               lambda *a, **k: None)
        waits = [loop.create_task(res.wait("elsewhere", None, False)) for _ in range(2)]
        while reads < 100:
            for w in waits:
                if w.done():
                    w.result()  # raises what ended the wait early
                    pytest.fail("a wait without a timeout returned")
            await asyncio.sleep(0.005)
        # Pruned once over 2 per waiter: at most 2 * 2 + 1 (100 if every one were kept).
        assert len(res.entries["elsewhere"].waiters) <= 5
        res.close()
        for w in waits:
            with pytest.raises(ferry.Unavailable):
                await w
    asyncio.run(main())
