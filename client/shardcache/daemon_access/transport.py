"""The client's hot-path wire to the daemon: keep-alive HTTP/1.1 over a Unix socket, one connection per
process+thread.

Why hand-written rather than httpx: the open call is the hot path of every shard a trainer reads, and 16
DataLoader workers on two cores make per-request CPU the latency. `bench/bench_open_latency.py` runs the
same open/close cycle through httpx over the socket (`httpx.HTTPTransport(uds=...)`, keep-alive, the release
in the next open's header) in the same run: 16 processes on two cores measured p50 1.26 ms / p99 3.05 ms
here against 38.6 ms / 78.4 ms with httpx, 31x and 26x (11,680 against 447 opens/s; a busy machine, so
the absolute figures are high, the ratio is what matters). So open and release go over a plain AF_UNIX
socket with a minimal HTTP/1.1 codec (`_Connection`) that pipelines: a lease release is sent at once but
its answer is read during the next request, which costs no extra round trip. Around it, the bookkeeping the
hot path needs: a connection per thread, a fresh one after fork (DataLoader workers fork; a parent's
socket must never be shared), and one retry when the daemon closed an idle keep-alive connection. The
streamed handoff (`stream`) uses the stdlib `http.client` on a connection of its own; everything else
(plans, stats, telemetry, probes) is httpx, in `control`.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import resource
import socket
import threading

from shardcache.errors import DaemonUnavailable, OutOfFileDescriptors, error_for_status
from shardcache.node import JSONValue


class UnixHTTPConnection(http.client.HTTPConnection):
    """`http.client.HTTPConnection` whose socket is a Unix stream socket at `path`."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Response:
    """A fully read answer: status, body bytes, and the JSON it holds."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> JSONValue:
        return json.loads(self.body) if self.body else None

    def raise_for_status(self, url: str | None = None) -> Response:
        """Raise the typed error for an error status (`{"error", "detail"}` bodies), naming `url`."""
        if self.status < 400:
            return self
        code, detail = "http_error", self.body.decode("utf-8", "replace")[:500]
        try:
            payload = json.loads(self.body)
            if isinstance(payload, dict):
                code = str(payload.get("error", code))
                raw = payload.get("detail", detail)
                detail = raw if isinstance(raw, str) else json.dumps(raw)
        except ValueError:
            pass
        raise error_for_status(self.status, code, detail, url)


class _Closed(Exception):
    """The daemon closed the connection before a whole answer arrived."""


RELEASE_HEADER = "Shardcache-Release"
# At most this many leases wait for the next request; more go out in a release request of their own.
MAX_HELD_RELEASES = 16


def encode_request(method: str, path: str, payload: bytes | None, releases: list[str] | None = None) -> bytes:
    """One HTTP/1.1 request as bytes (`path` is already percent-encoded ASCII).

    `releases`: leases the daemon ends before serving the request (the `Shardcache-Release` header).
    """
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    if releases:
        head += f"{RELEASE_HEADER}: {','.join(releases)}\r\n"
    if payload is None:
        return f"{head}\r\n".encode("ascii")
    head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode("ascii") + payload


class _Connection:
    """One keep-alive connection that may have several requests in flight (HTTP/1.1 pipelining).

    Hand-written instead of `http.client` for two reasons: http.client cannot send a request before the
    previous answer is read, and its header parsing (the email package) costs more CPU than the daemon's
    whole answer on this path. Answers are read in order from one buffered reader, so bytes read ahead
    belong to the next answer and are never lost.
    """

    __slots__ = ("sock", "reader", "unanswered", "reused")

    def __init__(self, path: str, timeout: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.unanswered = 0  # requests sent whose answers nobody has read yet
        self.reused = (
            False  # an answer came back on it: a later EOF means the daemon closed an idle connection
        )

    def read_answer(self) -> tuple[int, bytes, bool]:
        """(status, body, whether the daemon closes the connection after it)."""
        reader = self.reader
        line = reader.readline(65537)
        if not line:
            raise _Closed("connection closed before an answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise http.client.BadStatusLine(repr(line))
        status = int(parts[1])
        length: int | None = None
        chunked = close = False
        while True:
            header = reader.readline(65537)
            if header in (b"\r\n", b"\n"):
                break
            if not header:
                raise _Closed("connection closed inside an answer's headers")
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        if chunked:
            body = self._read_chunked()
        elif length is not None:
            body = reader.read(length)
            if len(body) < length:
                raise _Closed("connection closed inside an answer's body")
        elif status in (204, 304) or status < 200:
            body = b""
        else:
            body, close = reader.read(), True
        self.reused = True
        return status, body, close

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.reader.readline(65537).split(b";", 1)[0], 16)
            if size == 0:
                while self.reader.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            chunk = self.reader.read(size + 2)
            if len(chunk) < size + 2:
                raise _Closed("connection closed inside a chunked body")
            parts.append(chunk[:size])

    def skip_unanswered(self) -> None:
        while self.unanswered:
            self.unanswered -= 1
            self.read_answer()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


# Failures that mean the connection is gone; on a connection that already carried an answer, the daemon
# closed it while idle and a retry on a fresh one is safe.
_BROKEN = (_Closed, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
# At most this many unread answers per connection, far below what fills a socket buffer (a deadlock).
_MAX_UNANSWERED = 16


class Transport:
    """Keep-alive HTTP over a Unix socket, safe across threads and forks.

    Args:
        socket_path: the daemon's Unix socket.
        timeout: seconds a request may take (an open that misses waits for the download).
    """

    def __init__(self, socket_path: str, timeout: float, release_path: str = "/v1/shards/release") -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.release_path = release_path
        self._pid = os.getpid()
        self._local = threading.local()

    def _connection_state(self) -> None:
        if os.getpid() != self._pid:
            # Forked child: the inherited sockets (and held leases) belong to the parent. Drop them unread
            # and unclosed (reading or writing would steal or corrupt the parent's answers).
            self._pid = os.getpid()
            self._local = threading.local()

    def _connection(self) -> _Connection:
        """This thread's connection, connecting when there is none."""
        self._connection_state()
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = _Connection(self.socket_path, self.timeout)
            except OSError as exc:
                check_descriptors(exc)
                raise DaemonUnavailable(self.socket_path, describe(exc)) from exc
            self._local.conn = conn
        return conn

    def connect(self) -> None:
        """Open this thread's connection now if it has none (raises `DaemonUnavailable` like `request`)."""
        self._connection()

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def request(self, method: str, path: str, body: object = None) -> Response:
        """Send one request and read its whole answer (after any deferred answers still unread).

        Raises:
            DaemonUnavailable: the socket is missing, refuses, times out, or the connection broke twice.
        """
        payload = None if body is None else json.dumps(body).encode()
        data = encode_request(method, path, payload, self._take_releases())
        for attempt in (0, 1):
            conn = self._connection()
            reused = conn.reused or conn.unanswered > 0
            try:
                # Sent before the deferred answers are read: the daemon works on this request while they
                # are parsed, and both usually arrive in one read.
                conn.sock.sendall(data)
                conn.skip_unanswered()
                status, payload, close = conn.read_answer()
            except _BROKEN as exc:
                self._drop(conn)
                if reused and attempt == 0:
                    continue
                raise DaemonUnavailable(self.socket_path, f"connection lost ({exc})") from exc
            except TimeoutError as exc:
                self._drop(conn)
                raise DaemonUnavailable(self.socket_path, f"no answer within {self.timeout:g}s") from exc
            except (OSError, ValueError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise DaemonUnavailable(self.socket_path, describe(exc)) from exc
            if close:
                self._drop(conn)
            return Response(status, payload)
        raise AssertionError("unreachable")

    def hold_release(self, lease: str) -> None:
        """End `lease` with this thread's next request (its `Shardcache-Release` header).

        Saves the daemon a request when shards are opened in a tight loop. Held leases are also sent when
        there are `MAX_HELD_RELEASES` of them and by `close`; if the process dies first, they expire on
        the daemon.
        """
        held = self._held()
        held.append(lease)
        if len(held) >= MAX_HELD_RELEASES:
            self.flush_releases()

    def flush_releases(self) -> None:
        """Send the held leases now, as deferred release requests."""
        for lease in self._take_releases():
            self.send_deferred("POST", self.release_path, {"lease": lease})

    def _held(self) -> list[str]:
        self._connection_state()
        held: list[str] | None = getattr(self._local, "releases", None)
        if held is None:
            held = self._local.releases = []
        return held

    def take_releases(self) -> list[str]:
        """The leases this thread holds for its next request, handed over (for a request sent otherwise)."""
        return self._take_releases()

    def _take_releases(self) -> list[str]:
        held = self._held()
        taken = held[:]
        held.clear()
        return taken

    def send_deferred(self, method: str, path: str, body: object) -> None:
        """Send a request whose answer nobody waits for; it is read during this thread's next request.

        Used for lease releases: the daemon gets the release at once, but the reader does not sit through a
        round trip for a 204 it has no use for. Failures are ignored (an unreleased lease expires).
        """
        data = encode_request(method, path, json.dumps(body).encode())
        try:
            conn = self._connection()
        except DaemonUnavailable:
            return
        try:
            if conn.unanswered >= _MAX_UNANSWERED:
                conn.skip_unanswered()
            conn.sock.sendall(data)
            conn.unanswered += 1
        except (OSError, ValueError, http.client.HTTPException, _Closed):
            self._drop(conn)

    def stream(self, path: str) -> http.client.HTTPResponse:
        """GET `path` on a connection of its own and return the unread answer (a readable binary file).

        A separate connection, so that a long read does not hold up this thread's keep-alive connection.
        `Connection: close` makes http.client hand the socket over to the answer: closing the answer closes
        it.
        """
        conn = UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            return conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            check_descriptors(exc)
            raise DaemonUnavailable(self.socket_path, describe(exc)) from exc

    def close(self) -> None:
        """Close this thread's connection, reading deferred answers first so the daemon has acted on them.

        Other threads' connections close when their threads end.
        """
        if os.getpid() != self._pid:
            return
        self.flush_releases()
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        try:
            conn.skip_unanswered()
        except (OSError, ValueError, http.client.HTTPException, _Closed):
            pass
        self._drop(conn)


def check_descriptors(exc: BaseException) -> None:
    """Raise `OutOfFileDescriptors` when `exc` says this process (or the system) has no descriptor left:
    blaming the daemon would send the user to restart it, and reading directly would fail the same way."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.EMFILE, errno.ENFILE):
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    raise OutOfFileDescriptors(
        exc.errno,
        f"this process has run out of file descriptors (limit {soft}) reaching for the shardcached socket: "
        "close the iterators and shards you no longer read (iterator.close(), or drop them), or raise the "
        "limit (ulimit -n, systemd LimitNOFILE=)",
    ) from exc


def describe(exc: BaseException) -> str:
    """Why a connection to the socket failed, in words that say what to do."""
    if isinstance(exc, FileNotFoundError):
        return "the socket does not exist"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (the daemon is not running)"
    if isinstance(exc, PermissionError):
        return "permission denied (join the daemon's group or check the socket's mode)"
    return f"{type(exc).__name__}: {exc}"
