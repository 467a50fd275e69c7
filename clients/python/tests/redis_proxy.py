"""A Redis peer that lies: a TCP proxy in front of a real redis-server that forwards every
command and reply unchanged, except the writes it is told to refuse, which it answers itself
with an error reply (as a managed Redis or a proxy in front of one may, for a value it will not
take) instead of forwarding them, and the replies it is told to cut off (half of the reply, then
the connection closes, as Redis does to a client over its output buffer limit), and it may take
commands no faster than a slow network would. One thread per
connection, one command at a time (a pipeline is answered in order), RESP2, no Pub/Sub; for
tests only.

    proxy = RedisProxy(redis_port, refuse=lambda argv: ..., cut=lambda argv: ..., rate=...)
    ... point a process at proxy.port ...
    proxy.close()
"""

import socket
import threading
import time

from ferry._resp import _Incomplete, _parse


class _Reader:
    """Whole RESP2 items off a socket (what Ferry's clients and servers speak), parsed by the
    client's own parser, each with its raw bytes to forward as they came."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def next(self):
        """(raw bytes, value) of the next whole item: a command (a list of bytes) or a reply."""
        while True:
            try:
                value, end = _parse(self.buf, 0, len(self.buf))
            except _Incomplete:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    raise EOFError
                self.buf += chunk
                continue
            raw = bytes(self.buf[:end])
            del self.buf[:end]
            return raw, value


class RedisProxy:
    """Listens on 127.0.0.1:`port` (free); each connection gets its own to Redis at
    `redis_port`. A command for which refuse(argv) returns an error text (str) is answered
    "-<text>" and never reaches Redis; `refused` lists the argv of each. A command for which
    cut(argv) is true reaches Redis, and its client gets half of the reply before the proxy
    closes the connection; `cut_off` lists the argv of each. With `rate` (bytes a second), each
    command is forwarded no sooner than its bytes would come over a link of that speed."""

    def __init__(self, redis_port, refuse=None, cut=None, rate=None):
        self.redis_port = redis_port
        self.refuse = refuse or (lambda argv: None)
        self.cut = cut or (lambda argv: False)
        self.rate = rate
        self.refused = []
        self.cut_off = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._socks = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.redis_port))
            except OSError:
                client.close()  # Redis is gone: so is this connection
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._socks += [client, upstream]
            threading.Thread(target=self._serve, args=(client, upstream), daemon=True).start()

    def _serve(self, client, upstream):
        commands, replies = _Reader(client), _Reader(upstream)
        try:
            while True:
                raw, argv = commands.next()
                if not isinstance(argv, list):
                    raise ValueError("not a RESP command")
                if self.rate:
                    time.sleep(len(raw) / self.rate)
                error = self.refuse(argv)
                if error is not None:
                    with self._lock:
                        self.refused.append(argv)
                    client.sendall(b"-" + error.encode() + b"\r\n")
                    continue
                upstream.sendall(raw)
                reply, _ = replies.next()
                if self.cut(argv):
                    with self._lock:
                        self.cut_off.append(argv)
                    client.sendall(reply[:len(reply) // 2])
                    return  # closes both
                client.sendall(reply)
        except (EOFError, OSError, ValueError):
            pass
        finally:
            client.close()
            upstream.close()

    def close(self):
        """Stops listening and cuts every connection."""
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        except OSError:
            pass
        self._listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
