#!/usr/bin/python3
"""A Ferry producer written only from docs/protocol.md (stdlib + zmq + msgpack + redis).

Asks the broker's LIMITS, submits jobs for the "tiny" test model, checks rejections, ERROR and
STATS replies, waits for the results in Redis and compares them with the model's reference
formula; then a SUBMIT with "ack": false (no ACCEPTED, the job still runs), stored inputs,
attached inputs (their bytes in data frames after the body), and the result path: records inline
in FINISHED, a big one read with GET, a result notice through Redis Pub/Sub, and ids-only
FINISHED for a producer that stops reading.
"""
import argparse
import random
import struct
import sys
import time
import uuid

import msgpack
import redis
import zmq

TAG = b"FERRY1"
failures = []


def check(cond, what, expected, got):
    if not cond:
        failures.append("%s: expected %r, got %r" % (what, expected, got))
    return cond


def send(sock, command, body):
    frame = b"" if body is None else msgpack.packb(body, use_bin_type=True)
    sock.send_multipart([TAG, command, frame])


def recv(sock, finished, timeout_ms=5000):
    """Next reply as (command, body), recording and skipping unsolicited FINISHED notices."""
    deadline = time.monotonic() + timeout_ms / 1000.0
    while True:
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0 or not sock.poll(left):
            raise TimeoutError("no reply from the broker within %d ms" % timeout_ms)
        frames = sock.recv_multipart()
        if len(frames) != 3 or frames[0] != TAG:
            raise ValueError("reply does not follow the frame layout: %r" % frames)
        body = msgpack.unpackb(frames[2], raw=False) if frames[2] else {}
        if frames[1] == b"FINISHED":
            finished.update(body.get("ids", []))
            continue
        return frames[1].decode(), body


def tensor(values):
    return {"dtype": "float32", "shape": [len(values)], "data": struct.pack("<%df" % len(values), *values)}


def reference(x):
    return [sum(x[i] * (0.01 * (i * 8 + j) - 0.3) for i in range(8)) + 0.1 * j for j in range(8)]


def check_result(jid, raw, x):
    res = msgpack.unpackb(raw, raw=False)
    if not check(res.get("status") == "done", jid + " status", "done", (res.get("status"), res.get("error"))):
        return
    check(res.get("id") == jid, jid + " id", jid, res.get("id"))
    outs = res.get("outputs") or []
    if not check(len(outs) == 1, jid + " output count", 1, len(outs)):
        return
    out = outs[0]
    ok = check(out.get("dtype") == "float32", jid + " dtype", "float32", out.get("dtype"))
    ok &= check(list(out.get("shape", [])) == [8], jid + " shape", [8], out.get("shape"))
    ok &= check(len(out.get("data", b"")) == 32, jid + " data bytes", 32, len(out.get("data", b"")))
    if not ok:
        return
    got, want = struct.unpack("<8f", out["data"]), reference(x)
    check(all(abs(g - w) <= 1e-4 for g, w in zip(got, want)), jid + " values", want, list(got))


def read_results(store, prefix, ids, timeout_s=60.0):
    """Reads each id's result record from Redis, again every 5 ms until all are there or timeout_s
    has passed; returns {id: record} of those found."""
    got = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(ids) and time.monotonic() < deadline:
        left = [j for j in ids if j not in got]
        for j, raw in zip(left, store.mget([prefix + "result:" + j for j in left])):
            if raw is not None:
                got[j] = raw
        if len(got) < len(ids):
            time.sleep(0.005)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--frontend", required=True)
    ap.add_argument("--redis", required=True)
    ap.add_argument("--prefix", default="ferry:")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-results", action="store_true",
                    help="no worker is running: expect tiny to be unknown_model, skip result checks")
    args = ap.parse_args()

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.frontend)
    store = redis.Redis.from_url(args.redis)
    finished = set()

    # 0. LIMITS, what a client asks first on each connection: the broker's --max-message-bytes,
    #    --max-job-bytes and --max-jobs-per-message (the runner sets none of them: its defaults),
    #    the rid echoed.
    send(sock, b"LIMITS", {"rid": 100})
    cmd, body = recv(sock, finished)
    want = {"max_message_bytes": (64 << 20) + (1 << 20), "max_job_bytes": 64 << 20,
            "max_jobs_per_message": 10000, "rid": 100}
    check(cmd == "LIMITS" and {k: body.get(k) for k in want} == want, "reply to LIMITS",
          ("LIMITS", want), (cmd, body))

    # 1. Garbage. ERROR and STATS go out as soon as the broker reads their request (only
    #    ACCEPTED waits, for the journal), so a STATS with a rid after each garbage message tells
    #    exactly which replies the garbage produced.
    sock.send_multipart([b"hello"])
    send(sock, b"STATS", {"rid": 1})
    errors = []
    while True:
        cmd, body = recv(sock, finished)
        if cmd == "STATS" and body.get("rid") == 1:
            break
        errors.append((cmd, body))
    check(len(errors) == 1 and errors[0][0] == "ERROR" and isinstance(errors[0][1].get("code"), str),
          "reply to [b'hello']", "one ERROR with a code (malformed)", errors)

    sock.send_multipart([TAG, b"SUBMIT", b"\xc1not msgpack"])
    send(sock, b"STATS", {"rid": 2})
    errors = []
    while True:
        cmd, body = recv(sock, finished)
        if cmd == "STATS" and body.get("rid") == 2:
            stats = body
            break
        errors.append((cmd, body))
    check(len(errors) == 1 and errors[0][0] == "ERROR" and isinstance(errors[0][1].get("code"), str),
          "reply to SUBMIT with a non-msgpack body", "one ERROR with a code", errors)
    if errors and errors[0][0] == "ERROR":
        check(errors[0][1].get("code") == "malformed", "ERROR code", "malformed", errors[0][1].get("code"))
    check(isinstance(stats.get("workers"), list), "STATS workers", "a list", stats.get("workers"))
    check(isinstance(stats.get("queues"), dict), "STATS queues", "a map", stats.get("queues"))

    # 2. One SUBMIT: the good jobs, one malformed tensor, one unknown model.
    rng = random.Random(args.seed)
    run = uuid.uuid4().hex[:12]
    inputs, jobs = {}, []
    for n in range(args.jobs):
        x = [rng.uniform(-1.0, 1.0) for _ in range(8)]
        jid = "py-%s-%d" % (run, n)
        inputs[jid] = list(struct.unpack("<8f", struct.pack("<8f", *x)))  # as the model sees it
        jobs.append({"id": jid, "model": "tiny", "inputs": [tensor(x)]})
    bad_id, unknown_id = "py-%s-malformed" % run, "py-%s-unknown" % run
    bad = tensor([0.0] * 8)
    bad["data"] = bad["data"][:30]  # 30 bytes for a [8] float32 tensor
    jobs.append({"id": bad_id, "model": "tiny", "inputs": [bad]})
    jobs.append({"id": unknown_id, "model": "no-such-model", "inputs": [tensor([1.0] * 8)]})
    send(sock, b"SUBMIT", {"jobs": jobs, "rid": 3})
    cmd, acc = recv(sock, finished)
    if not check(cmd == "ACCEPTED", "reply to SUBMIT", "ACCEPTED", (cmd, acc)):
        return report(args, 0)
    check(acc.get("rid") == 3, "ACCEPTED rid", 3, acc.get("rid"))
    rejected = {r.get("id"): r.get("code") for r in acc.get("rejected", [])}
    good = set(inputs)
    want_rejected = {bad_id: "invalid_argument", unknown_id: "unknown_model"}
    if args.no_results:
        want_rejected.update({jid: "unknown_model" for jid in good})
        good = set()
    check(set(acc.get("ids", [])) == good, "ACCEPTED ids", sorted(good), sorted(acc.get("ids", [])))
    check(rejected == want_rejected, "ACCEPTED rejected", want_rejected, rejected)

    # 3. Wait for every accepted result: GET all pending ids each round; between rounds wait
    #    5 ms on the socket so that a FINISHED notice wakes us at once.
    pending = set(acc.get("ids", [])) & good
    deadline = time.monotonic() + 60.0
    while pending and time.monotonic() < deadline:
        hinted = finished & pending
        order = sorted(pending)
        for jid, raw in zip(order, store.mget([args.prefix + "result:" + j for j in order])):
            if raw is not None:
                check_result(jid, raw, inputs[jid])
                pending.discard(jid)
            elif jid in hinted:
                check(False, jid + " after FINISHED", "result readable in Redis", None)
                pending.discard(jid)
        if pending and sock.poll(5):
            while sock.poll(0):  # only FINISHED notices are expected here
                frames = sock.recv_multipart()
                body = msgpack.unpackb(frames[2], raw=False) if len(frames) == 3 and frames[2] else {}
                if frames[:2] == [TAG, b"FINISHED"]:
                    finished.update(body.get("ids", []))
                else:
                    check(False, "unsolicited message", "only FINISHED", frames)
    check(not pending, "results within 60 s", 0, "%d missing, e.g. %s" % (len(pending), sorted(pending)[:3]))
    stray = finished - set(acc.get("ids", []))
    check(not stray, "FINISHED ids", "only accepted ids", sorted(stray))
    n_results, n_finished = len(good) - len(pending), len(finished & good)

    # 4. "ack": false: no ACCEPTED for a job that was accepted -- the next SUBMIT's ACCEPTED is
    #    the first reply -- and the job still gets its result.
    if not args.no_results:
        x = [rng.uniform(-1.0, 1.0) for _ in range(8)]
        quiet, loud = "py-%s-quiet" % run, "py-%s-loud" % run
        send(sock, b"SUBMIT", {"jobs": [{"id": quiet, "model": "tiny", "inputs": [tensor(x)]}],
                               "ack": False, "rid": 4})
        send(sock, b"SUBMIT", {"jobs": [{"id": loud, "model": "tiny", "inputs": [tensor(x)]}],
                               "rid": 5})
        cmd, acc = recv(sock, finished)
        check(cmd == "ACCEPTED" and acc.get("rid") == 5 and acc.get("ids") == [loud],
              "first reply after a SUBMIT with ack false", "ACCEPTED rid 5 for the second job",
              (cmd, acc))
        raw = read_results(store, args.prefix, [quiet]).get(quiet)
        if check(raw is not None, quiet + " (ack false) result within 60 s", "a result", None):
            check_result(quiet, raw, list(struct.unpack("<8f", struct.pack("<8f", *x))))

    # 5. Stored inputs (the claim check): the bytes go to <prefix>input:<id>:<index> before the
    #    SUBMIT, the job names them {"dtype", "shape", "stored": true}; the worker reads them and
    #    deletes them with the result. A missing key fails its job with not_found, bytes of the
    #    wrong size with invalid_argument.
    if not args.no_results:
        x = [rng.uniform(-1.0, 1.0) for _ in range(8)]
        stored, missing, short = ("py-%s-stored" % run, "py-%s-stored-missing" % run,
                                  "py-%s-stored-short" % run)
        store.set(args.prefix + "input:%s:0" % stored, struct.pack("<8f", *x), ex=600)
        store.set(args.prefix + "input:%s:0" % short, b"\0" * 30, ex=600)
        ref = {"dtype": "float32", "shape": [8], "stored": True}
        send(sock, b"SUBMIT", {"jobs": [{"id": j, "model": "tiny", "inputs": [ref]}
                                        for j in (stored, missing, short)], "rid": 6})
        cmd, acc = recv(sock, finished)
        check(cmd == "ACCEPTED" and acc.get("ids") == [stored, missing, short],
              "ACCEPTED of stored-input jobs", [stored, missing, short], (cmd, acc))
        got = read_results(store, args.prefix, [stored, missing, short])
        if check(len(got) == 3, "stored-input results within 60 s", 3, len(got)):
            check_result(stored, got[stored], list(struct.unpack("<8f", struct.pack("<8f", *x))))
            for j, code in ((missing, "not_found"), (short, "invalid_argument")):
                res = msgpack.unpackb(got[j], raw=False)
                check(res.get("status") == "failed" and res.get("error", {}).get("code") == code,
                      j + " result", ("failed", code), (res.get("status"), res.get("error")))
            left = [j for j in (stored, short) if store.exists(args.prefix + "input:%s:0" % j)]
            check(not left, "stored inputs deleted with their results", [], left)

    # 6. Attached inputs: {"dtype", "shape", "attached": true} in the body, the bytes as data
    #    frames after it, jobs in order. A job rejected for another reason (unknown model) and
    #    one whose frame has the wrong size still take their frames, so the jobs after them get
    #    their own; a frame count that does not match is an ERROR (malformed) for the message.
    if not args.no_results:
        att = {"dtype": "float32", "shape": [8], "attached": True}
        xs = [[rng.uniform(-1.0, 1.0) for _ in range(8)] for _ in range(3)]
        first, unknown, short, last = ("py-%s-attached-%s" % (run, n)
                                       for n in ("first", "unknown", "short", "last"))
        jobs = [{"id": first, "model": "tiny", "inputs": [att]},
                {"id": unknown, "model": "no-such-model", "inputs": [att]},
                {"id": short, "model": "tiny", "inputs": [att]},
                {"id": last, "model": "tiny", "inputs": [att]}]
        sock.send_multipart([TAG, b"SUBMIT",
                             msgpack.packb({"jobs": jobs, "rid": 7}, use_bin_type=True),
                             struct.pack("<8f", *xs[0]), struct.pack("<8f", *xs[1]),
                             b"\0" * 30, struct.pack("<8f", *xs[2])])
        cmd, acc = recv(sock, finished)
        check(cmd == "ACCEPTED" and acc.get("rid") == 7 and acc.get("ids") == [first, last],
              "ACCEPTED of attached-input jobs", [first, last], (cmd, acc))
        rejected = {r.get("id"): r.get("code") for r in acc.get("rejected", [])}
        want = {unknown: "unknown_model", short: "invalid_argument"}
        check(rejected == want, "attached-input rejections", want, rejected)
        got = read_results(store, args.prefix, [first, last])
        if check(len(got) == 2, "attached-input results within 60 s", 2, len(got)):
            for j, x in ((first, xs[0]), (last, xs[2])):
                check_result(j, got[j], list(struct.unpack("<8f", struct.pack("<8f", *x))))
        # One attached tensor, no data frame.
        sock.send_multipart([TAG, b"SUBMIT", msgpack.packb(
            {"jobs": [{"id": "py-%s-attached-lost" % run, "model": "tiny", "inputs": [att]}],
             "rid": 8}, use_bin_type=True)])
        send(sock, b"STATS", {"rid": 9})
        replies = []
        while True:
            cmd, body = recv(sock, finished)
            if cmd == "STATS" and body.get("rid") == 9:
                break
            replies.append((cmd, body.get("code")))
        check(replies == [("ERROR", "malformed")], "reply to a SUBMIT missing its data frame",
              [("ERROR", "malformed")], replies)

    # 7. The result path. "inline_results": true: FINISHED maps a small result's id to its
    #    record, byte for byte the one in Redis; a record over the worker's
    #    --inline-result-bytes (16 KiB: here the null model returning a 64 KB input) comes as an
    #    id alone, read with GET. "notify": the worker publishes the notice on our Redis Pub/Sub
    #    channel (subscribed before the SUBMIT), with the record inside, and the broker sends no
    #    FINISHED for that job.
    if not args.no_results:
        x = [rng.uniform(-1.0, 1.0) for _ in range(8)]
        small, big = "py-%s-inline-small" % run, "py-%s-inline-big" % run
        big_bytes = struct.pack("<16000f", *(rng.uniform(-1.0, 1.0) for _ in range(16000)))
        send(sock, b"SUBMIT", {"jobs": [
            {"id": small, "model": "tiny", "inputs": [tensor(x)]},
            {"id": big, "model": "null",
             "inputs": [{"dtype": "float32", "shape": [16000], "data": big_bytes}]}],
            "inline_results": True, "rid": 10})
        cmd, acc = recv(sock, finished)
        check(cmd == "ACCEPTED" and acc.get("ids") == [small, big],
              "ACCEPTED of inline-result jobs", [small, big], (cmd, acc))
        notices = wait_finished(sock, {small, big})
        if check(set(notices) == {small, big}, "FINISHED of inline-result jobs", [small, big],
                 sorted(notices)):
            raw = store.get(args.prefix + "result:" + small)
            check(notices[small] == raw, small + " inline record", "the bytes of its GET",
                  notices[small] if notices[small] is None else len(notices[small]))
            if raw is not None:
                check_result(small, raw, list(struct.unpack("<8f", struct.pack("<8f", *x))))
            check(notices[big] is None, big + " in FINISHED", "its id without a record",
                  "a record" if notices[big] else None)
            res = msgpack.unpackb(store.get(args.prefix + "result:" + big) or b"\x80", raw=False)
            outs = res.get("outputs") or [{}]
            check(res.get("status") == "done" and outs[0].get("data") == big_bytes,
                  big + " result by GET", "done, its input back", res.get("status"))

        channel = args.prefix + "notify:py-%s" % run
        sub = store.pubsub()
        sub.subscribe(channel)
        first = sub.get_message(timeout=5.0)
        check(first is not None and first.get("type") == "subscribe", "SUBSCRIBE confirmed",
              "subscribe", first)
        x = [rng.uniform(-1.0, 1.0) for _ in range(8)]
        told = "py-%s-notified" % run
        send(sock, b"SUBMIT", {"jobs": [{"id": told, "model": "tiny", "inputs": [tensor(x)]}],
                               "notify": channel, "inline_results": True, "rid": 11})
        cmd, acc = recv(sock, finished)
        check(cmd == "ACCEPTED" and acc.get("ids") == [told], "ACCEPTED of a notify job", [told],
              (cmd, acc))
        message = sub.get_message(timeout=30.0)
        if check(message is not None and message.get("type") == "message", "the job's notice",
                 "a Pub/Sub message", message):
            notice = msgpack.unpackb(message["data"], raw=False)
            record = (notice.get("results") or {}).get(told)
            check(notice.get("ids") == [told] and record is not None, "notice body",
                  {"ids": [told], "results": {told: "..."}}, notice)
            raw = store.get(args.prefix + "result:" + told)
            check(record == raw, told + " notice record", "the bytes of its GET", None)
            if raw is not None:
                check_result(told, raw, list(struct.unpack("<8f", struct.pack("<8f", *x))))
        sub.close()
        # The worker may hold the DONE that names the job as notified for a few ms: give a
        # FINISHED that should not come time to, then round-trip a STATS past it.
        time.sleep(0.3)
        send(sock, b"STATS", {"rid": 12})
        while True:
            cmd, body = recv(sock, finished)
            if cmd == "STATS" and body.get("rid") == 12:
                break
        check(told not in finished, told + " FINISHED", "none (its worker notified)", "a FINISHED")

    # 8. A producer that stops reading. The inline records waiting unsent for one connection are
    #    bounded in bytes (the broker's --max-inline-backlog-bytes; the runner's fleet: 100,000):
    #    past that, FINISHED carries ids only, until the producer reads again. Every id still
    #    comes once, and every record that does come is the one in Redis. 1,000 records of ~16
    #    KB: far more than the socket buffers between us and the broker hold.
    if not args.no_results:
        check_unread_backlog(ctx, args, store, run, rng)
    return report(args, n_results, n_finished)


def check_unread_backlog(ctx, args, store, run, rng, jobs=1000, floats=3900):
    slow = ctx.socket(zmq.DEALER)
    slow.setsockopt(zmq.LINGER, 0)
    slow.setsockopt(zmq.RCVHWM, 1)  # hold as little as possible on this side
    slow.setsockopt(zmq.RCVBUF, 65536)
    slow.connect(args.frontend)
    data = struct.pack("<%df" % floats, *(rng.uniform(-1.0, 1.0) for _ in range(floats)))
    ids = ["py-%s-backlog-%d" % (run, i) for i in range(jobs)]
    for k in range(0, jobs, 100):  # 1.6 MB SUBMITs, far under --max-message-bytes
        send(slow, b"SUBMIT", {"jobs": [
            {"id": j, "model": "null",
             "inputs": [{"dtype": "float32", "shape": [floats], "data": data}]}
            for j in ids[k:k + 100]], "inline_results": True})
    # Every result lands in Redis while `slow` is not read.
    stored = read_results(store, args.prefix, ids, timeout_s=120.0)
    check(len(stored) == jobs, "backlog jobs' results in Redis", jobs, len(stored))
    # Now read: the ACCEPTEDs, and FINISHED until every id has come.
    accepted, announced, inline = [], {}, 0
    deadline = time.monotonic() + 60.0
    while len(announced) < jobs and time.monotonic() < deadline:
        if not slow.poll(100):
            continue
        frames = slow.recv_multipart()
        body = msgpack.unpackb(frames[2], raw=False) if len(frames) == 3 and frames[2] else {}
        if frames[:2] == [TAG, b"ACCEPTED"]:
            accepted += body.get("ids", [])
            continue
        if not check(frames[:2] == [TAG, b"FINISHED"], "backlog reply", "ACCEPTED or FINISHED",
                     frames[:2]):
            continue
        for jid in body.get("ids", []):
            announced[jid] = announced.get(jid, 0) + 1
        for jid, record in (body.get("results") or {}).items():
            inline += 1
            check(record == stored.get(jid), jid + " inline record", "the bytes of its GET",
                  len(record))
    slow.close()
    check(sorted(accepted) == sorted(ids), "backlog jobs accepted", jobs, len(accepted))
    twice = sorted(j for j, n in announced.items() if n != 1)
    check(set(announced) == set(ids) and not twice, "backlog FINISHED: every id once",
          jobs, "%d announced, %d more than once" % (len(announced), len(twice)))
    # Some came inline (the backlog had room at first), and not all: the rest were ids only.
    check(0 < inline < jobs, "inline records past the backlog", "some, not all", inline)
    print("python_client: %d of %d records came inline to a producer that stopped reading"
          % (inline, jobs))


def wait_finished(sock, ids, timeout_s=60.0):
    """FINISHED notices until every id in `ids` was named: {id: its inline record or None}."""
    got = {}
    deadline = time.monotonic() + timeout_s
    while not ids <= set(got) and time.monotonic() < deadline:
        if not sock.poll(50):
            continue
        frames = sock.recv_multipart()
        body = msgpack.unpackb(frames[2], raw=False) if len(frames) == 3 and frames[2] else {}
        if frames[:2] != [TAG, b"FINISHED"]:
            check(False, "message while waiting for FINISHED", "only FINISHED", frames[:2])
            continue
        records = body.get("results") or {}
        for jid in body.get("ids", []):
            got[jid] = records.get(jid)
    return got


def report(args, n_results, n_finished=0):
    if failures:
        for f in failures:
            print("FAIL " + f)
        print("python_client: %d check(s) failed" % len(failures))
        return 1
    mode = "no-results mode" if args.no_results else "%d results correct, %d FINISHED notices" % (
        n_results, n_finished)
    print("python_client: OK (%s; LIMITS, rejections, ERROR and STATS as documented)" % mode)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (TimeoutError, ValueError, zmq.ZMQError, redis.RedisError) as e:
        print("FAIL %s: %s" % (type(e).__name__, e))
        sys.exit(1)
