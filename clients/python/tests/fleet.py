"""A real Ferry fleet for the tests: redis-server in a temp dir, ferry-broker, ferry-worker(s)
on free loopback ports, each a child process that is killed (and its dir removed) at the end.
Optionally secured as docs/security.md says: CURVE on the broker's sockets (keys from
`ferry keygen`, allow-lists for producers and workers), a Redis password (read from files, never
on a command line), Redis over TLS only (certificates from the openssl CLI, a test CA).

Binaries: $FERRY_BROKER_BIN, $FERRY_WORKER_BIN, $FERRY_MAKE_MODELS_BIN, $FERRY_CLI_BIN (CMake
passes them), else the repository's build/ tree.
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


def redis_server():
    """The server the tests start: $FERRY_TEST_REDIS_SERVER (a Valkey build, say), as in the
    C++ tests, else Debian's redis-server."""
    return os.environ.get("FERRY_TEST_REDIS_SERVER") or "/usr/bin/redis-server"


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


def make_test_ca(d, names=("server", "client")):
    """A CA and, per name, a certificate it signed (NAME.crt, NAME.key; valid for 127.0.0.1)
    in d, with the openssl CLI. Returns d."""
    def run(*args):
        subprocess.run(args, cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=ferry-test-ca", "-keyout", "ca.key", "-out", "ca.crt")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in names:
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + name,
            "-keyout", name + ".key", "-out", name + ".csr")
        run("openssl", "x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "san.ext",
            "-out", name + ".crt")
    return d


class Fleet:
    """redis-server + broker + workers. Each piece can be killed and started again.

    curve=True: `ferry keygen` makes keys/broker, keys/worker, keys/producer and
    keys/stranger; the broker allows producer (allow-producers/) and worker (allow-workers/).
    redis_password: Redis requires it (requirepass in its config file); the broker and workers
    read it from password_file. redis_tls=True: Redis listens on a TLS port only
    (tls-auth-clients optional), certificates of a test CA in tls/ (ca.crt; server.*,
    client.*); the fleet connects with rediss:// and --redis-tls-ca."""

    def __init__(self, models_dir, models=("tiny",), workers=1, worker_args=(),
                 broker_args=(), models_file=None, curve=False, redis_password=None,
                 redis_tls=False):
        self.dir = tempfile.mkdtemp(prefix="ferry-py-")
        self.models_dir = models_dir
        self.models = models
        self.models_file = models_file
        self.worker_args = list(worker_args)
        self.broker_args = list(broker_args)
        self.redis_port = free_port()
        self.frontend_port = free_port()
        self.backend_port = free_port()
        self.redis_password = redis_password
        self.redis_tls = redis_tls
        self.redis_url = "%s://127.0.0.1:%d" % ("rediss" if redis_tls else "redis",
                                               self.redis_port)
        self.frontend = "tcp://127.0.0.1:%d" % self.frontend_port
        self.redis_proc = None
        self.broker_proc = None
        self.worker_procs = []
        self._logs = []
        self.curve = curve
        self.keys = os.path.join(self.dir, "keys")
        self.password_file = None
        self.tls = os.path.join(self.dir, "tls")
        try:
            if curve:
                self._make_keys()
            if redis_password is not None:
                self.password_file = os.path.join(self.dir, "redis-password")
                fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(redis_password + "\n")
            if redis_tls:
                os.mkdir(self.tls)
                make_test_ca(self.tls)
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

    def _make_keys(self):
        cli = binary("FERRY_CLI_BIN", "producer-sdk/ferry")
        for name in ("broker", "worker", "producer", "stranger"):
            subprocess.run([cli, "keygen", self.keys, name], check=True,
                           stdout=subprocess.DEVNULL)
        for role, name in (("producers", "producer"), ("workers", "worker")):
            d = os.path.join(self.dir, "allow-" + role)
            os.mkdir(d)
            shutil.copy(self.key(name), d)

    def key(self, name, secret=False):
        """keys/NAME.key (public) or keys/NAME.key_secret."""
        return os.path.join(self.keys, name + (".key_secret" if secret else ".key"))

    def client_options(self, producer="producer"):
        """What a client of this fleet needs besides the frontend and the Redis URL."""
        o = {}
        if self.curve:
            o["curve_server_public"] = self.key("broker")
            o["curve_secret"] = self.key(producer, secret=True)
        if self.password_file:
            o["redis_password_file"] = self.password_file
        if self.redis_tls:
            o["redis_tls_ca"] = os.path.join(self.tls, "ca.crt")
        return o

    @property
    def redis_socket(self):
        """Redis's Unix-domain socket (unix:// + this is its URL)."""
        return os.path.join(self.dir, "redis.sock")

    def _redis_args(self, url=None):
        """The broker's and workers' Redis flags (secrets in files); `url` in place of
        Redis's own (a proxy in front of it)."""
        argv = ["--redis", url or self.redis_url]
        if self.password_file:
            argv += ["--redis-password-file", self.password_file]
        if self.redis_tls:
            argv += ["--redis-tls-ca", os.path.join(self.tls, "ca.crt")]
        return argv

    def redis(self):
        kw = {}
        if self.redis_password is not None:
            kw["password"] = self.redis_password
        if self.redis_tls:
            kw.update(ssl=True, ssl_ca_certs=os.path.join(self.tls, "ca.crt"),
                      ssl_cert_reqs="required")
        return redis_py.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=5, **kw)

    def start_redis(self):
        conf = ["bind 127.0.0.1", 'save ""', "appendonly no", "dir " + self.dir,
                "daemonize no", "unixsocket " + self.redis_socket, "unixsocketperm 700"]
        if self.redis_tls:
            t = self.tls
            conf += ["port 0", "tls-port %d" % self.redis_port,
                     "tls-cert-file " + os.path.join(t, "server.crt"),
                     "tls-key-file " + os.path.join(t, "server.key"),
                     "tls-ca-cert-file " + os.path.join(t, "ca.crt"),
                     "tls-auth-clients optional"]
        else:
            conf.append("port %d" % self.redis_port)
        if self.redis_password is not None:
            conf.append("requirepass " + self.redis_password)
        path = os.path.join(self.dir, "redis.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(conf) + "\n")
        self.redis_proc = self._spawn("redis", [redis_server(), path])

        def up():
            try:
                return self.redis().ping()
            except redis_py.RedisError:
                assert self.redis_proc.poll() is None, self.log_tail("redis")
                return False
        wait_for(up, 20, "redis-server")

    def start_broker(self):
        argv = [binary("FERRY_BROKER_BIN", "broker/ferry-broker"),
                "--frontend", self.frontend,
                "--backend", "tcp://127.0.0.1:%d" % self.backend_port] + self._redis_args()
        if self.curve:
            argv += ["--curve-secret", self.key("broker", secret=True),
                     "--allow-producers", os.path.join(self.dir, "allow-producers"),
                     "--allow-workers", os.path.join(self.dir, "allow-workers")]
        self.broker_proc = self._spawn("broker", argv + self.broker_args)

    def start_worker(self, extra=(), redis_url=None):
        """A worker; redis_url: it reaches Redis there (a proxy), not at Redis's own port."""
        i = len(self.worker_procs)
        argv = [binary("FERRY_WORKER_BIN", "gpu-worker/ferry-worker"),
                "--broker", "tcp://127.0.0.1:%d" % self.backend_port,
                "--device", "cpu", "--name", "py-worker-%d" % i] + self._redis_args(redis_url)
        if self.curve:
            argv += ["--curve-server-public", self.key("broker"),
                     "--curve-secret", self.key("worker", secret=True)]
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
        if self.curve:
            import zmq.auth
            s.curve_serverkey, _ = zmq.auth.load_certificate(self.key("broker"))
            s.curve_publickey, s.curve_secretkey = zmq.auth.load_certificate(
                self.key("producer", secret=True))
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
