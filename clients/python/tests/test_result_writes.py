"""Result writes Redis refuses or cuts off, each on a fleet whose worker reaches Redis through a
RedisProxy (redis_proxy.py): a refusal for good becomes a failed result, a refused write that got
through is no duplicate, a round retried or cut off keeps the answers it read, a big result's
notice goes once, and an ACL without PUBLISH makes results without notices."""

import contextlib
import os
import re
import uuid

import numpy as np

import ferry
from conftest import assert_tiny
from fleet import Fleet, wait_for


def _metric(metrics_port, series):
    """The value of `series` (a name and its labels, as Prometheus writes them) at the
    broker's /metrics; 0 when absent."""
    import urllib.request
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
    return float(m.group(1)) if m else 0.0


def _finished(metrics_port, model, status):
    """The broker's ferry_jobs_finished_total{model, status}."""
    return _metric(metrics_port,
                   'ferry_jobs_finished_total{model="%s",status="%s"}' % (model, status))


# The error reply Redis gives while it loads its data: one that says to wait (retried).
_LOADING = "LOADING Redis is loading the dataset in memory"


def _result_write_key(argv):
    """The key of a result write as the worker sends it (SET, or the notice script's EVAL);
    None for any other command."""
    name = argv[0].upper()
    return argv[1] if name == b"SET" else argv[3] if name == b"EVAL" else None


@contextlib.contextmanager
def _proxied_fleet(models_dir, models, refuse, cut=None):
    """A Fleet serving `models`, its broker's /metrics on a free port, and one worker that
    reaches the fleet's Redis through a RedisProxy with `refuse` (and `cut`), at the broker:
    yields (fleet, metrics port, proxy), and stops them after. `refuse` and `cut` see the
    worker's first commands (its PING) before the yield: the names they use that the test binds
    in the `with` (the proxy, a Redis connection) are for result writes, which come later."""
    from fleet import free_port
    from redis_proxy import RedisProxy
    metrics = free_port()
    f = Fleet(models_dir, models=models, workers=0, broker_args=["--metrics-port", str(metrics)])
    proxy = None
    try:
        proxy = RedisProxy(f.redis_port, refuse, cut)
        f.start_worker(redis_url="redis://127.0.0.1:%d" % proxy.port)
        f.wait_workers(1)
        yield f, metrics, proxy
    finally:
        f.stop()
        if proxy is not None:
            proxy.close()


def test_a_result_redis_refuses_for_good_becomes_a_failure_that_keeps_the_jobs_ttl(models_dir):
    # The worker reaches Redis through a proxy that refuses the first write of two jobs'
    # results with an error reply that no retry cures (as a managed Redis or a proxy may for a
    # value it will not take): a small record (the notice script) and one too big to go inline
    # (SET, then PUBLISH). The worker stores a `failed` record (code internal, saying why) in
    # its place, plainly and with the job's own expiry (not the default); the producer waiting
    # for it is told, the broker counts the job failed, and the worker goes on serving.
    small, big = ("py-refused-%s-%s" % (kind, uuid.uuid4().hex[:8]) for kind in ("small", "big"))
    keys = {("ferry:result:" + job).encode(): job for job in (small, big)}
    refused_keys = []

    def refuse(argv):
        key = _result_write_key(argv)
        if key in keys and key not in refused_keys:
            refused_keys.append(key)
            return "ERR the value is refused by the test proxy"
        return None
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny", "null"), refuse) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            assert_tiny(c.run("tiny", x, timeout=30), x)  # through the proxy, untouched
            c.submit("tiny", x, id=small, result_ttl_s=7777)
            c.submit("null", np.ones(100000, np.float32), id=big, result_ttl_s=7777)
            for job in (small, big):
                r = c.wait(job, timeout=60)
                assert r.status == "failed" and r.error[0] == "internal", (job, r)
                assert r.error[1] == ("Redis refused this job's result: ERR the value is "
                                      "refused by the test proxy"), r
                ttl = f.redis().ttl("ferry:result:" + job)
                assert 7000 < ttl <= 7777, ttl  # the job's, not the worker's --result-ttl-s
            assert sorted(argv[0].upper() for argv in proxy.refused) == [b"EVAL", b"SET"]
            assert "Redis refused its result for good" in f.log_tail("worker0")
            # The DONE may reach the broker after the producer read the record.
            for model in ("tiny", "null"):
                wait_for(lambda: _finished(metrics, model, "failed") == 1, 10,
                         "the broker's count of %s jobs failed" % model)
            assert_tiny(c.run("tiny", x, timeout=30), x)  # still serving


def test_a_refused_write_that_got_through_leaves_the_job_done(models_dir):
    # The proxy runs the write on Redis and then answers it with a final error anyway (a write
    # whose reply was lost in an outage and replaced by another, say). The worker's failure
    # record then finds the job's own result there (SET NX: nil): the job stays `done`, in Redis
    # and in the broker's count.
    job = "py-got-through-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()

    def refuse(argv):
        if _result_write_key(argv) != key or proxy.refused:
            return None
        store.execute_command(*argv)  # it got through
        return "ERR the reply is refused by the test proxy"
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), refuse) as (f, metrics, proxy):
        store = f.redis()
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit("tiny", x, id=job)
            assert_tiny(c.wait(job, timeout=60), x)
            # The record got through before the proxy noted its refusal: the wait may be first.
            wait_for(lambda: len(proxy.refused) == 1, 10, "the proxy's refusal")
            wait_for(lambda: "Redis refused its result for good" in f.log_tail("worker0"), 10,
                     "the worker's log of the refusal")
            wait_for(lambda: _finished(metrics, "tiny", "done") == 1, 10,
                     "the broker's count of jobs done")
            assert _finished(metrics, "tiny", "failed") == 0
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0


def test_a_round_retried_for_one_result_keeps_the_others_answers(models_dir):
    # Three jobs' results in one write round: job a's write gets an error reply that says to
    # wait (LOADING, once); job b's finds a record there (b ran before under the same id: SET NX
    # answers nil, a duplicate); job c's is stored. The worker writes the round again, sending
    # only a's write: b counts as one duplicate (before, a retried round counted none, its nil
    # being its own answer again), c's record and notice are not sent twice, b's first result
    # stands.
    a, b, c_ = ("py-retried-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "abc")
    key = {job: ("ferry:result:" + job).encode() for job in (a, b, c_)}
    writes = []  # the result keys the worker wrote, in order, once the round is under way

    def refuse(argv):
        k = _result_write_key(argv)
        if k is None or not armed:
            return None
        writes.append(k)
        return _LOADING if writes == [key[a]] else None
    armed = []
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), refuse) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            assert_tiny(c.run("tiny", x, id=b, timeout=30), x)
            armed.append(True)
            c.submit_many([{"model": "tiny", "inputs": [x * (k + 2)], "id": job}
                           for k, job in enumerate((a, b, c_))])
            assert_tiny(c.wait(a, timeout=30), x * 2)
            assert_tiny(c.wait(c_, timeout=30), x * 4)
            # One SUBMIT, one CHUNK, one batch: one round of three writes, then a's again.
            wait_for(lambda: "3 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            wait_for(lambda: _metric(metrics, "ferry_duplicates_suppressed_total") == 1, 10,
                     "the broker's count of duplicates")
            assert writes == [key[a], key[b], key[c_], key[a]], writes
            assert_tiny(c.wait(b, timeout=30), x)  # the first result of b stands
            assert _finished(metrics, "tiny", "failed") == 0


def test_a_round_cut_off_partway_keeps_the_answers_it_read(models_dir):
    # Two jobs' results in one write round: a's write is answered OK; the connection breaks in
    # the middle of b's reply (the proxy sends half of it and closes). The worker writes the
    # round again on a new connection, sending only b's write, which finds b's record there
    # (it got through): no duplicate, since its answer was lost, not refused. Before, a broken
    # connection threw away the answers read before it, and the retry wrote a again too.
    a, b = ("py-cut-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "ab")
    key = {job: ("ferry:result:" + job).encode() for job in (a, b)}
    writes = []  # the result keys the worker wrote, in order

    def seen(argv):
        k = _result_write_key(argv)
        if k is not None:
            writes.append(k)
        return None

    def cut(argv):
        return _result_write_key(argv) == key[b] and writes.count(key[b]) == 1
    x = np.linspace(-1, 1, 8).astype(np.float32)
    with _proxied_fleet(models_dir, ("tiny",), seen, cut) as (f, metrics, proxy):
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit_many([{"model": "tiny", "inputs": [x * (k + 2)], "id": job}
                           for k, job in enumerate((a, b))])
            assert_tiny(c.wait(a, timeout=30), x * 2)
            assert_tiny(c.wait(b, timeout=30), x * 3)
            # One SUBMIT, one CHUNK, one batch: one round of two writes, then b's again.
            wait_for(lambda: "2 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            assert len(proxy.cut_off) == 1
            wait_for(lambda: _finished(metrics, "tiny", "done") == 2, 10,
                     "the broker's count of jobs done")
            assert writes == [key[a], key[b], key[b]], writes
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0


def test_a_write_refused_after_it_got_through_is_no_duplicate_when_its_round_is_retried(
        models_dir):
    # Two big results (plain SET, then PUBLISH) in one round: a's write gets LOADING (once), d's
    # is run on Redis and then answered with an error no retry cures (its reply lost and
    # replaced, say). The round is retried for a's sake, and d's write with it: its SET NX finds
    # d's own record (nil). That is no duplicate and no refusal: both jobs are done.
    a, d = ("py-got-through-%s-%s" % (k, uuid.uuid4().hex[:8]) for k in "ad")
    key_a, key_d = (("ferry:result:" + job).encode() for job in (a, d))
    answered = set()

    def refuse(argv):
        k = _result_write_key(argv)
        if k not in (key_a, key_d) or k in answered:
            return None
        answered.add(k)
        if k == key_a:
            return _LOADING
        store.execute_command(*argv)  # it got through
        return "ERR the reply is refused by the test proxy"
    xs = {a: np.full(100000, 2, np.float32), d: np.full(100000, 3, np.float32)}
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy):
        store = f.redis()
        with ferry.Client(f.frontend, f.redis_url) as c:
            c.submit_many([{"model": "null", "inputs": [xs[job]], "id": job} for job in (a, d)])
            for job in (a, d):
                r = c.wait(job, timeout=30)
                assert r.status == "done", (job, r)
                np.testing.assert_array_equal(r.outputs[0], xs[job])
            wait_for(lambda: "2 results not written (attempt 1)" in f.log_tail("worker0"), 10,
                     "the worker's log of the retried round")
            wait_for(lambda: _finished(metrics, "null", "done") == 2, 10,
                     "the broker's count of jobs done")
            assert _metric(metrics, "ferry_duplicates_suppressed_total") == 0
            assert "refused its result" not in f.log_tail("worker0")


@contextlib.contextmanager
def _notice_counter(f):
    """A pattern subscription to every client's notice channel in f's Redis, for as long as the
    `with` lasts. Yields a function that counts the notices naming a job that came since its
    last call (each waits 1 s for more)."""
    notices = f.redis().pubsub()
    notices.psubscribe("ferry:notify:*")

    def notices_of(job_id):
        n = 0
        while True:
            m = notices.get_message(timeout=1)
            if m is None:
                return n
            if m["type"] == "pmessage" and job_id.encode() in m["data"]:
                n += 1
    try:
        yield notices_of
    finally:
        notices.close()


def _until_subscribed(c, notices_of):
    """Runs warm-up jobs on `c` until one's notice comes on its channel (a client subscribes to
    its channel on its first job). Returns how many it ran."""
    warm_ups = []

    def subscribed():
        warm_up = "py-warm-up-" + uuid.uuid4().hex[:8]
        warm_ups.append(warm_up)
        assert c.run("null", np.ones(4, np.float32), id=warm_up, timeout=30).ok
        return notices_of(warm_up) == 1
    wait_for(subscribed, 20, "a notice of a warm-up job")
    return len(warm_ups)


def test_a_big_results_notice_goes_once_however_often_its_write_is_retried(models_dir):
    # A record too big for the notice script goes as SET NX, then PUBLISH of a notice naming
    # the job, in one pipeline. Redis answers the SET three times with LOADING (it still runs
    # the PUBLISH): the notice went out with the first try, and the retries, which store the
    # record at the fourth, do not send it again. The producer gets its result all the same.
    job = "py-notice-once-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()
    loading = []

    def refuse(argv):
        if _result_write_key(argv) != key or len(loading) == 3:
            return None
        loading.append(argv)
        return _LOADING
    x = np.full(100000, 5, np.float32)
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy), \
            _notice_counter(f) as notices_of, ferry.Client(f.frontend, f.redis_url) as c:
        warm_ups = _until_subscribed(c, notices_of)
        r = c.run("null", x, id=job, timeout=30)
        assert r.status == "done", r
        np.testing.assert_array_equal(r.outputs[0], x)
        assert [argv[0].upper() for argv in loading] == [b"SET"] * 3  # not the script
        # DONE follows the last round: every notice there will be has been published.
        wait_for(lambda: _finished(metrics, "null", "done") == warm_ups + 1, 10,
                 "the broker's count of jobs done")
        assert notices_of(job) == 1


def test_a_result_read_before_its_early_notice_came_true_is_read_again_on_finished(
        models_dir, monkeypatch):
    # The notice of a big record goes with the first try of its write: when Redis refuses that
    # SET (LOADING), the producer hears of a record that is not there yet and reads nothing.
    # The worker's next try stores it -- held back here until the test has seen, through
    # MONITOR, the producer's GET that found nothing -- and the broker's FINISHED (the job is
    # not in DONE's `notified`) must make the producer read again. Its own re-checks are set to
    # ten minutes, so without that the run times out.
    import threading
    from ferry import _results
    monkeypatch.setattr(_results, "FIRST_RECHECK", 600.0)
    monkeypatch.setattr(_results, "MAX_RECHECK", 600.0)
    job = "py-read-again-" + uuid.uuid4().hex[:8]
    key = ("ferry:result:" + job).encode()
    read_nothing = threading.Event()
    loading = []

    def refuse(argv):
        if _result_write_key(argv) != key:
            return None
        if not loading:
            loading.append(argv)
            return _LOADING
        assert read_nothing.wait(30), "the producer never read the result early"
        return None

    def watch(monitor):
        for command in monitor.listen():
            if command["command"] == "GET " + key.decode():
                read_nothing.set()
                return
    x = np.full(100000, 7, np.float32)
    with _proxied_fleet(models_dir, ("null",), refuse) as (f, metrics, proxy), \
            _notice_counter(f) as notices_of, f.redis().monitor() as monitor, \
            ferry.Client(f.frontend, f.redis_url) as c:
        warm_ups = _until_subscribed(c, notices_of)
        threading.Thread(target=watch, args=(monitor,), daemon=True).start()
        r = c.run("null", x, id=job, timeout=20)
        assert r.status == "done", r
        np.testing.assert_array_equal(r.outputs[0], x)
        assert read_nothing.is_set()
        assert [argv[0].upper() for argv in loading] == [b"SET"]
        assert notices_of(job) == 1  # the early one, and no other
        assert _finished(metrics, "null", "done") == warm_ups + 1


def test_an_acl_without_publish_makes_the_worker_write_results_without_notices(models_dir):
    # The worker's ACL user may run the notice script and PUBLISH, but on no channel (the
    # `&ferry:notify:*` of deploy/redis/users.acl forgotten): inside the script Redis 7.0 says
    # "The user executing the script can't publish to the channel ...", without NOPERM, after
    # the script's SET stored the record. The worker takes it for what it is: it writes results
    # without notices from then on (the broker's FINISHED tells the producer), and no job is
    # failed or logged as refused. Flat rules, no selectors: Redis 6.2 takes them too.
    f = Fleet(models_dir, models=("tiny",), workers=0)
    xs = [np.linspace(-1, 1, 8).astype(np.float32) * k for k in range(1, 6)]
    try:
        pw = uuid.uuid4().hex
        f.redis().execute_command(
            "ACL", "SETUSER", "py-no-publish", "on", ">" + pw, "resetchannels", "-@all",
            "+ping", "+set", "+eval", "+publish", "+get", "+del", "~ferry:result:*",
            "~ferry:input:*")
        pw_file = os.path.join(f.dir, "no-publish.pw")
        with open(pw_file, "w") as out:
            out.write(pw + "\n")
        f.start_worker(redis_url="redis://py-no-publish@127.0.0.1:%d" % f.redis_port,
                       extra=["--redis-password-file", pw_file])
        f.wait_workers(1)
        with ferry.Client(f.frontend, f.redis_url) as c:
            for x in xs:
                assert_tiny(c.run("tiny", x, timeout=60), x)
        log = f.log_tail("worker0", 200)
        assert "writing results without notices from now on" in log, log
        assert "refused its result" not in log, log
    finally:
        f.stop()
