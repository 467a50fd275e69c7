"""A real Ferry fleet for the tests: redis-server in a temp dir, ferry-broker, ferry-worker(s)
on free loopback ports, each a child process that is killed (and its dir removed) at the end.

Binaries: $FERRY_BROKER_BIN, $FERRY_WORKER_BIN, $FERRY_MAKE_MODELS_BIN (CMake passes them),
else the repository's build/ tree.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis as redis_py

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def binary(env, rel):
    path = os.environ.get(env) or os.path.join(REPO, "build", rel)
    if not os.access(path, os.X_OK):
        raise RuntimeError("%s not found (set %s or build %s)" % (path, env, rel))
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout=30.0, what="condition", every=0.01):
    """Polls cond() until it is truthy (returns its value) or raises after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(every)


def make_models(outdir, names):
    subprocess.run([binary("FERRY_MAKE_MODELS_BIN", "gpu-worker/ferry-make-models"), outdir]
                   + list(names), check=True, stdout=subprocess.DEVNULL)


class Fleet:
    """redis-server + broker + workers. Each piece can be killed and started again."""

    def __init__(self, models_dir, models=("tiny",), workers=1, worker_args=(),
                 broker_args=(), models_file=None):
        self.dir = tempfile.mkdtemp(prefix="ferry-py-")
        self.models_dir = models_dir
        self.models = models
        self.models_file = models_file
        self.worker_args = list(worker_args)
        self.broker_args = list(broker_args)
        self.redis_port = free_port()
        self.frontend_port = free_port()
        self.backend_port = free_port()
        self.redis_url = "redis://127.0.0.1:%d" % self.redis_port
        self.frontend = "tcp://127.0.0.1:%d" % self.frontend_port
        self.redis_proc = None
        self.broker_proc = None
        self.worker_procs = []
        self._logs = []
        try:
            self.start_redis()
            self.start_broker()
            for _ in range(workers):
                self.start_worker()
            self.wait_workers(workers)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def redis(self):
        return redis_py.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=5)

    def start_redis(self):
        self.redis_proc = self._spawn("redis", [
            "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"])

        def up():
            try:
                return self.redis().ping()
            except redis_py.RedisError:
                assert self.redis_proc.poll() is None, self.log_tail("redis")
                return False
        wait_for(up, 20, "redis-server")

    def start_broker(self):
        self.broker_proc = self._spawn("broker", [
            binary("FERRY_BROKER_BIN", "broker/ferry-broker"),
            "--frontend", self.frontend,
            "--backend", "tcp://127.0.0.1:%d" % self.backend_port,
            "--redis", self.redis_url] + self.broker_args)

    def start_worker(self, extra=()):
        i = len(self.worker_procs)
        argv = [binary("FERRY_WORKER_BIN", "gpu-worker/ferry-worker"),
                "--broker", "tcp://127.0.0.1:%d" % self.backend_port,
                "--redis", self.redis_url, "--device", "cpu", "--name", "py-worker-%d" % i]
        if self.models_file:
            argv += ["--models", self.models_file]
        else:
            for m in self.models:
                argv += ["--model", "%s=%s" % (m, os.path.join(self.models_dir, m + ".pt"))]
        p = self._spawn("worker%d" % i, argv + self.worker_args + list(extra))
        self.worker_procs.append(p)
        return p

    def stats(self):
        """The broker's STATS, through a throwaway DEALER (no client involved)."""
        import msgpack
        import zmq
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.frontend)
        try:
            s.send_multipart([b"FERRY1", b"STATS", msgpack.packb({"rid": 7})])
            while s.poll(2000):
                f = s.recv_multipart()
                if f[1] == b"STATS":
                    return msgpack.unpackb(f[2], raw=False)
            return None
        finally:
            s.close()

    def wait_workers(self, n, timeout=90):
        def ready():
            for name, p in [("broker", self.broker_proc)] + [
                    ("worker%d" % i, w) for i, w in enumerate(self.worker_procs)]:
                if p is not None and p.poll() is not None:
                    raise AssertionError("%s exited: %s" % (name, self.log_tail(name)))
            st = self.stats()
            return st is not None and len(st["workers"]) >= n
        wait_for(ready, timeout, "%d worker(s) at the broker" % n, every=0.05)

    def kill(self, proc, sig=signal.SIGKILL):
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(30)

    def restart_broker(self):
        self.kill(self.broker_proc)
        self.start_broker()

    def restart_redis(self):
        self.kill(self.redis_proc)
        self.start_redis()

    def log_tail(self, name, n=30):
        try:
            with open(os.path.join(self.dir, name + ".log"), "rb") as f:
                return b"".join(f.readlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        for p in self.worker_procs:
            self.kill(p)
        self.kill(self.broker_proc)
        self.kill(self.redis_proc)
        for log in self._logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
