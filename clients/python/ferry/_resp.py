"""Redis for the client, spoken directly (RESP2 over asyncio): pipelined commands on one
connection, and a Pub/Sub connection for result notices.

Why not redis.asyncio: the redis-py that Debian bookworm ships (4.3.4) leaves the reply of a
cancelled command on the connection, where the next command reads it (CVE-2023-28858/28859) --
a client whose callers time out would hand one job's result to another. Here a reply always
goes to the command that asked, in order, whether or not its caller still waits; a command that
gets no reply within its timeout closes the connection and fails every command on it.
"""

import asyncio
import socket
import ssl
import urllib.parse

from ._errors import InvalidArgument, Unavailable

__all__ = ["Endpoint", "parse_redis_url", "Connection", "Commands", "ReplyError"]


class ReplyError(Exception):
    """An error reply from Redis (-ERR ...): a value, not a broken connection."""


class Endpoint:
    """Where and how to connect: from the URL and the client's redis_* options."""

    __slots__ = ("url", "host", "port", "path", "db", "username", "password", "ssl")

    @property
    def address(self):
        """host:port, or unix:PATH: where it connects, for messages."""
        return "unix:" + self.path if self.path else "%s:%d" % (self.host, self.port)

    def __repr__(self):  # never the password
        return "Endpoint(%s db=%d tls=%s user=%r)" % (self.address, self.db,
                                                      self.ssl is not None, self.username)


def parse_redis_url(url, password_file=None, tls_ca=None, tls_cert=None, tls_key=None):
    """redis://[user[:password]@]host:port[/db], rediss://... (TLS) or
    unix://[user[:password]@]/path[?db=N] (a Unix-domain socket on this host) -> Endpoint.

    password_file: a file holding the password (one line; trailing newline ignored), instead
    of one in the URL (not both, as the C++ SDK). TLS (rediss://): the server certificate is
    verified against tls_ca (else the system's CAs); tls_cert + tls_key are the client's own
    certificate for servers that ask for one (tls-auth-clients). The certificate must name the
    URL's host (a DNS name or an IP address in its subjectAltName), as the C++ side checks."""
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError:  # its text may quote a piece of the password
        raise InvalidArgument("Redis URL %r: bad host, port or user part (percent-encode '/', "
                              "'?' and '#' in a password)" % _redact(url))
    e = Endpoint()
    e.url = _redact(url)
    if u.scheme == "unix":
        # unix:///path?db=N, as redis-py and the C++ side take it
        if (not url.startswith("unix://") or not u.path.startswith("/") or u.hostname or port
                or u.fragment):
            raise InvalidArgument("Redis URL %r: want unix://[user[:password]@]/path[?db=N] "
                                  "(an absolute socket path)" % _redact(url))
        if len(u.path.encode()) > 107:
            raise InvalidArgument("Redis URL %r: the socket path is longer than 107 bytes"
                                  % _redact(url))
        db = u.query[3:] if u.query.startswith("db=") else None
        if ("?" in url and not (db and db.isascii() and db.isdigit()
                                and int(db) <= 1 << 30)):
            raise InvalidArgument("Redis URL %r: the one query parameter of a unix:// URL is "
                                  "db=NUMBER" % _redact(url))
        e.host, e.port, e.path = None, 0, u.path
        e.db = int(db) if db else 0
    else:
        if u.scheme not in ("redis", "rediss") or not u.hostname:
            raise InvalidArgument("Redis URL %r: want redis://[user[:password]@]host:port[/db], "
                                  "rediss://... or unix:///path" % _redact(url))
        e.host = u.hostname
        e.port = port or 6379
        e.path = None
        path = u.path.lstrip("/")
        if path and not path.isdigit():
            raise InvalidArgument("Redis URL %r: the database must be a number" % _redact(url))
        if u.query or u.fragment:
            raise InvalidArgument("Redis URL %r: query parameters are not supported (use the "
                                  "redis_* options)" % _redact(url))
        e.db = int(path) if path else 0
    e.username = urllib.parse.unquote(u.username) if u.username else None
    e.password = urllib.parse.unquote(u.password) if u.password else None
    if password_file:
        if e.password is not None:
            raise InvalidArgument("the Redis password is given twice, in the URL and in "
                                  "redis_password_file: give it once")
        try:
            with open(password_file, "r", encoding="utf-8") as f:
                text = f.read().rstrip("\r\n")
        except OSError as err:
            raise InvalidArgument("redis_password_file %s: %s" % (password_file, err))
        if not text:
            raise InvalidArgument("redis_password_file %s is empty" % password_file)
        if "\n" in text:
            raise InvalidArgument("redis_password_file %s has more than one line; it holds the "
                                  "password alone" % password_file)
        e.password = text
    if e.username and e.password is None:
        raise InvalidArgument("Redis URL %r: a user needs a password" % _redact(url))
    e.ssl = None
    tls_files = (tls_ca, tls_cert, tls_key)
    if u.scheme == "rediss":
        if bool(tls_cert) != bool(tls_key):
            raise InvalidArgument("redis_tls_cert and redis_tls_key go together")
        try:
            ctx = ssl.create_default_context(cafile=tls_ca) if tls_ca else \
                ssl.create_default_context()
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.check_hostname = True  # against the URL's host (asyncio passes it)
            if tls_cert:
                ctx.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as err:
            raise InvalidArgument("Redis TLS files: %s" % err)
        e.ssl = ctx
    elif any(tls_files):
        raise InvalidArgument("redis_tls_ca/cert/key need a rediss:// URL (got %r)" % _redact(url))
    return e


def _redact(url):
    """The URL with its password replaced by ***, by the C++ side's rule (RedactRedisUrl): the
    password runs from the first ':' after the scheme to the last '@' (for unix://, the last
    before the path's first '/'). Works on URLs that do not parse too."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    limit = len(url)
    if url.startswith("unix://"):
        slash = url.find("/", start)
        limit = slash if slash >= 0 else limit
    at = url.rfind("@", 0, limit)
    if at < start:
        return _redact_port(url, start)
    colon = url.find(":", start)
    if colon < 0 or colon > at:
        return url
    return url[:colon + 1] + "***" + url[at:]


def _redact_port(url, start):
    """A URL without '@' whose "port" is no port (1..65535): perhaps USER:PASSWORD with @HOST
    left out, the password holding '/' or '?' too: nothing from that ':' on is shown (as the
    C++ side does). Others are returned as they are."""
    if url.startswith("unix://"):
        return url
    end = min([i for i in (url.find(c, start) for c in "/?#") if i >= 0] or [len(url)])
    hostport = url[start:end]
    if hostport.startswith("["):  # [IPv6]:PORT
        colon = hostport.find("]:")
        colon = colon + 1 if colon >= 0 else -1
    else:
        colon = hostport.find(":")
    if colon < 0:
        return url
    port = hostport[colon + 1:]
    if port.isascii() and port.isdigit() and 1 <= int(port) <= 65535:
        return url
    return url[:start + colon + 1] + "***"


def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = b"%d" % a
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(b"\r\n")
    return out


class _Incomplete(Exception):
    pass


_INCOMPLETE = _Incomplete()


def _parse(buf, pos, end):
    """One RESP2 reply from buf[pos:end]: (value, next pos); raises _INCOMPLETE."""
    nl = buf.find(b"\r\n", pos, end)
    if nl < 0:
        raise _INCOMPLETE
    t = buf[pos]
    if t == 36:  # $ bulk string
        n = int(buf[pos + 1:nl])
        if n < 0:
            return None, nl + 2
        start = nl + 2
        if end < start + n + 2:
            raise _INCOMPLETE
        return bytes(memoryview(buf)[start:start + n]), start + n + 2
    if t == 42:  # * array
        n = int(buf[pos + 1:nl])
        if n < 0:
            return None, nl + 2
        pos = nl + 2
        items = []
        for _ in range(n):
            v, pos = _parse(buf, pos, end)
            items.append(v)
        return items, pos
    if t == 43:  # + simple string
        return bytes(buf[pos + 1:nl]).decode(), nl + 2
    if t == 58:  # : integer
        return int(buf[pos + 1:nl]), nl + 2
    if t == 45:  # - error
        return ReplyError(bytes(buf[pos + 1:nl]).decode(errors="replace")), nl + 2
    raise ValueError("not a RESP reply (byte %r)" % bytes(buf[pos:pos + 1]))


# Replies are read into a buffer of this size (grown for a bigger reply, shrunk back after).
_READ_BUFFER = 64 * 1024
# A bulk reply at least this long that has not fully arrived is read straight into a bytearray
# of its own, which becomes the reply's value: the kernel's copy is the only one (a 960 KB
# result was copied five times by the data_received parser before: bytes from recv, the
# buffer, a slice, bytes(), each into freshly faulted-in memory).
_BIG_BULK = 64 * 1024
# ... up to Redis's own default bound on a value (proto-max-bulk-len): a bigger one is read as
# it arrives, so that a header alone never makes the client allocate more.
_MAX_BIG_BULK = 512 << 20


def _keepalive(sock):
    """TCP keepalive probes, as the C++ subscriber's (hiredis's redisKeepAlive with its 15 s):
    after 15 s idle, every 5 s, 3 of them. A subscriber only reads: without them a Redis that
    vanished without a FIN/RST (a dead host, a NAT that forgot the flow) would leave it waiting
    for good, its channel still named in every SUBMIT and its notices lost."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Linux names the idle time TCP_KEEPIDLE, macOS TCP_KEEPALIVE; a platform without one of
    # these keeps its default for it.
    idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))
    for option, value in ((idle, 15), (getattr(socket, "TCP_KEEPINTVL", None), 5),
                          (getattr(socket, "TCP_KEEPCNT", None), 3)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class Connection(asyncio.BufferedProtocol):
    """One connection. call() pipelines: commands made in one turn of the loop are written
    together, replies resolve their futures in order. In Pub/Sub mode (on_push given),
    ["message", channel, payload] pushes go to on_push(payload). A bulk reply's value is bytes,
    or a bytearray for a big one (_BIG_BULK to _MAX_BIG_BULK bytes, not inside an array) that
    had not arrived whole when its header did."""

    def __init__(self, loop, on_push=None, on_lost=None):
        self._loop = loop
        self._transport = None
        self._buf = bytearray(_READ_BUFFER)  # replies not yet parsed: _buf[:_len]
        self._len = 0
        self._bulk = None    # the big bulk reply being read into its own bytearray
        self._bulk_got = 0   # bytes of it read so far
        self._crlf_due = False  # the CRLF that ends a big bulk reply is still to come
        self._fifo = []  # futures awaiting replies, oldest first
        self._head = 0
        self._out = []
        self._flush_scheduled = False
        self._on_push = on_push
        self._on_lost = on_lost
        self.closed = False
        self.error = None
        self._received = 0  # bytes read, handed to the transport, and queued: see progress()
        self._written = 0
        self._queued = 0

    @classmethod
    async def open(cls, endpoint, loop, timeout, on_push=None, on_lost=None, select_db=True):
        conn = cls(loop, on_push, on_lost)
        try:
            connect = (loop.create_unix_connection(lambda: conn, endpoint.path)
                       if endpoint.path else
                       loop.create_connection(lambda: conn, endpoint.host, endpoint.port,
                                              ssl=endpoint.ssl))
            await asyncio.wait_for(connect, timeout)
            hello = []
            if endpoint.password is not None:
                hello.append(conn.call("AUTH", endpoint.username, endpoint.password)
                             if endpoint.username else conn.call("AUTH", endpoint.password))
            if select_db and endpoint.db:
                hello.append(conn.call("SELECT", endpoint.db))
            if hello:
                for r in await asyncio.wait_for(asyncio.gather(*hello), timeout):
                    if isinstance(r, ReplyError):
                        why = str(r)
                        if endpoint.password:  # a server or proxy that echoes its arguments
                            why = why.replace(endpoint.password, "***")
                        raise Unavailable("Redis at %s refused the connection: %s"
                                          % (endpoint.address, why))
        except (OSError, asyncio.TimeoutError, ssl.SSLError, ConnectionError) as e:
            conn.close()
            why = str(e) or type(e).__name__
            if endpoint.ssl is not None and isinstance(e, (asyncio.TimeoutError, ssl.SSLError)):
                why += " (is it a plain-TCP port? use redis://)"
            raise Unavailable("Redis at %s: %s" % (endpoint.address, why))
        except BaseException:
            conn.close()
            raise
        return conn

    # -- asyncio.Protocol
    def connection_made(self, transport):
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._on_push is not None:
                    _keepalive(sock)
            except OSError:
                pass

    def get_buffer(self, sizehint):
        if self._bulk is not None:
            return memoryview(self._bulk)[self._bulk_got:]
        if self._len == len(self._buf):  # full of one unfinished reply: give it more room
            bigger = bytearray(2 * len(self._buf))
            bigger[:self._len] = self._buf
            self._buf = bigger
        return memoryview(self._buf)[self._len:]

    def buffer_updated(self, nbytes):
        self._received += nbytes
        try:
            if self._bulk is not None:
                self._bulk_got += nbytes
                if self._bulk_got == len(self._bulk):
                    value, self._bulk = self._bulk, None
                    self._crlf_due = True
                    self._reply(value)
                return
        except Exception as e:  # a reply nobody asked for
            self.error = e
            self._transport.abort()
            return
        self._len += nbytes
        buf, end, pos = self._buf, self._len, 0
        try:
            while pos < end:
                if self._crlf_due:
                    if end - pos < 2:
                        break
                    if buf[pos:pos + 2] != b"\r\n":
                        raise ValueError("a bulk reply not ended by CRLF")
                    self._crlf_due = False
                    pos += 2
                    continue
                try:
                    value, pos = _parse(buf, pos, end)
                except _Incomplete:
                    # Not all here: a big bulk string (36: $) reads the rest into its own buffer.
                    if buf[pos] == 36 and self._start_big_bulk(buf, pos, end):
                        pos = end
                    break
                self._reply(value)
        except Exception as e:  # a protocol error: this connection is unusable
            self.error = e
            self._transport.abort()
            return
        rest = end - pos
        if rest == 0 and len(self._buf) > _READ_BUFFER:
            self._buf = bytearray(_READ_BUFFER)  # a big reply grew it: give the memory back
        elif pos:
            view = memoryview(buf)
            view[:rest] = view[pos:end]
        self._len = rest
        if self._head > 64 and self._head * 2 > len(self._fifo):
            del self._fifo[:self._head]
            self._head = 0

    def _start_big_bulk(self, buf, pos, end):
        """True when buf[pos:end], a bulk reply that has not fully arrived, is a big one: what is
        here moves to a bytearray of the reply's size, and the rest is read into it."""
        nl = buf.find(b"\r\n", pos, end)
        if nl < 0:
            return False
        n = int(buf[pos + 1:nl])
        have = end - (nl + 2)
        if n < _BIG_BULK or n > _MAX_BIG_BULK or have >= n:
            return False
        self._bulk = bytearray(n)
        self._bulk[:have] = memoryview(buf)[nl + 2:end]
        self._bulk_got = have
        return True

    def _reply(self, value):
        """One parsed reply: a Pub/Sub push, or the reply to the oldest command waiting."""
        if (self._on_push is not None and type(value) is list and len(value) == 3
                and value[0] == b"message"):
            self._on_push(value[2])
            return
        if self._head >= len(self._fifo):
            raise ValueError("a reply nobody asked for")
        fut = self._fifo[self._head]
        self._fifo[self._head] = None
        self._head += 1
        if not fut.done():
            fut.set_result(value)

    def connection_lost(self, exc):
        self.closed = True
        err = Unavailable("Redis connection lost: %s" % (self.error or exc or "closed"))
        for fut in self._fifo[self._head:]:
            if fut is not None and not fut.done():
                fut.set_exception(err)
        self._fifo = []
        self._head = 0
        if self._on_lost is not None:
            cb, self._on_lost = self._on_lost, None
            cb()

    # -- commands
    def call(self, *args):
        """A future for the reply to one command (ReplyError for an error reply)."""
        fut = self._loop.create_future()
        if self.closed or self._transport is None:
            fut.set_exception(Unavailable("Redis connection is closed"))
            return fut
        self._fifo.append(fut)
        parts = _encode(args)
        self._out.extend(parts)
        for part in parts:
            self._queued += len(part)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self):
        self._flush_scheduled = False
        if self._out and not self.closed:
            out, self._out = self._out, []
            # A big value (an input stored by claim check) is written by itself: writelines
            # joins everything into one bytes object first (Python 3.11), a copy of every input
            # byte, while write() hands the caller's buffer to send() as it is and copies only
            # what the socket did not take.
            small = []
            for part in out:
                if len(part) < _BIG_BULK:
                    small.append(part)
                    continue
                if small:
                    self._write(b"".join(small))
                    small = []
                self._write(part)
            if small:
                self._write(b"".join(small))

    def _write(self, data):
        self._written += len(data)
        self._transport.write(data)

    def queued(self):
        """Bytes of every command made so far: where the last one ends in what goes out."""
        return self._queued

    def progress(self, upto):
        """Bytes this connection has moved for the commands up to the byte `upto` of what goes
        out (queued() after the last of them): replies read (later commands' replies come after
        theirs), plus their bytes written out of the transport's buffer to the socket. It grows
        while a big value goes out or comes in, however slowly, but not with the bytes of
        commands made after them."""
        flushed = self._written
        if self._transport is not None:
            flushed -= self._transport.get_write_buffer_size()
        return self._received + min(flushed, upto)

    def pending(self):
        return len(self._fifo) - self._head

    def close(self):
        self.closed = True
        if self._transport is not None:
            self._transport.abort()


class Commands:
    """Lazily connected command connection, reconnected after a failure. execute() bounds each
    command by `timeout` seconds in which the connection moves no byte: a reply that is late
    by that closes the connection (every command on it fails with Unavailable), so a late reply
    can never be read as another command's. A big value going out or coming in slowly is not
    late while it moves (as the C++ SDK's socket timeouts, which bound each read and write).
    After close() every command fails with Unavailable: nothing reconnects."""

    def __init__(self, endpoint, loop, timeout):
        self._endpoint = endpoint
        self._loop = loop
        self._timeout = timeout
        self._conn = None
        self._connecting = None
        self.closed = False

    def connected(self):
        """Whether a connection is open now (a command then opens none)."""
        return not self.closed and self._conn is not None and not self._conn.closed

    async def _connection(self):
        if self.closed:
            raise Unavailable("the client is closed")
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            self._connecting = self._loop.create_task(
                Connection.open(self._endpoint, self._loop, self._timeout))
        task = self._connecting
        try:
            conn = await asyncio.shield(task)
        except asyncio.CancelledError:
            if self.closed and task.cancelled():  # close() stopped it, not our caller
                raise Unavailable("the client is closed")
            raise
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None
        if self.closed:  # closed while it connected
            conn.close()
            raise Unavailable("the client is closed")
        self._conn = conn
        return conn

    async def execute(self, *args, timeout=None):
        """One command's reply (a ReplyError raised). `timeout`: the caller's own bound in
        seconds, when less than the connection's (a wait with little time left), connecting
        included: one deadline for both. Past it the call raises Unavailable, but the command
        stays on the connection (its reply, when it comes, is dropped), so the other callers'
        commands on it go on; only a reply later than the connection's timeout closes it, as
        always -- also after a caller that gave up or was cancelled."""
        value = (await self.execute_many((args,), timeout))[0]
        if isinstance(value, ReplyError):
            raise value
        return value

    async def execute_many(self, commands, timeout=None):
        """Several commands in one round trip; their replies (ReplyError values included).
        `timeout` as execute's, for all of them."""
        bounded = timeout is not None and timeout < self._timeout
        deadline = self._loop.time() + timeout if bounded else None
        if bounded:
            try:
                conn = await asyncio.wait_for(self._connection(), timeout)
            except asyncio.TimeoutError:
                raise Unavailable("Redis at %s: not connected within %g s"
                                  % (self._endpoint.address, timeout)) from None
        else:
            conn = await self._connection()
        futs = [conn.call(*c) for c in commands]
        # A reply later than the connection's timeout closes it (replies come in order: the last
        # one's timer watches them all); the timer goes with that reply. Errors are marked read,
        # so that those nobody looks at (a caller that gave up, the rest of a pipeline after its
        # first error) are not logged by asyncio as never retrieved.
        futs[-1].add_done_callback(_Expiry(self._loop, self._timeout, conn, futs[-1]).cancel)
        for f in futs:
            f.add_done_callback(_retrieve)
        # asyncio.wait neither cancels the commands nor raises on them: a caller that gives up
        # or is cancelled leaves their replies to the connection, whose timer still watches.
        _, pending = await asyncio.wait(
            futs, timeout=None if deadline is None else max(0.0, deadline - self._loop.time()))
        if pending:
            raise Unavailable("Redis at %s: no reply within %g s"
                              % (self._endpoint.address, timeout))
        return [f.result() for f in futs]

    def send(self, *args):
        """One command put on the open connection now, ahead of any command made after it, its
        reply not awaited: its future (a ReplyError as its value for an error reply), bounded
        as execute's; None when no connection is open."""
        if not self.connected():
            return None
        fut = self._conn.call(*args)
        fut.add_done_callback(_Expiry(self._loop, self._timeout, self._conn, fut).cancel)
        fut.add_done_callback(_retrieve)
        return fut

    def close(self):
        self.closed = True
        if self._conn is not None:
            self._conn.close()
        if self._connecting is not None:
            self._connecting.cancel()


def _retrieve(fut):
    if not fut.cancelled():
        fut.exception()


class _Expiry:
    """Closes `conn` when `fut`, the reply to its last command, is still not there after
    `timeout` seconds (to a quarter more) in which the connection moved none of the bytes of
    that command and those before it (Connection.progress): Redis is gone or stalled, not slow
    to take or give a big value. Later commands going out do not keep it alive."""

    def __init__(self, loop, timeout, conn, fut):
        self._loop, self._timeout, self._conn, self._fut = loop, timeout, conn, fut
        self._upto = conn.queued()
        self._seen = conn.progress(self._upto)
        self._moved_at = loop.time()
        self._handle = loop.call_later(timeout / 4, self._check)

    def _check(self):
        if self._fut.done():
            return
        now = self._loop.time()
        moved = self._conn.progress(self._upto)
        if moved != self._seen:
            self._seen, self._moved_at = moved, now
        elif now - self._moved_at >= self._timeout:
            self._conn.error = "no reply within the timeout"
            self._conn.close()
            return
        self._handle = self._loop.call_later(self._timeout / 4, self._check)

    def cancel(self, _fut=None):
        self._handle.cancel()
