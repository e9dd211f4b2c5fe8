"""The client's wire to the daemon: keep-alive HTTP/1.1 over a Unix socket, one connection per process+thread.

Why hand-rolled rather than httpx: the open call is the hot path of every shard a trainer reads, and 16
DataLoader workers on two cores make per-request CPU the latency. DESIGN.md measured an httpx client at
p99 ~30 ms there and a bare keep-alive client at 6-8 ms, so this module is the stdlib `http.client` with a
socket that connects to AF_UNIX, plus the little bookkeeping it needs: a connection per thread (http.client
is not thread-safe), a fresh one after fork (DataLoader workers fork; a parent's socket must never be
shared), one retry on a keep-alive connection the server closed, and release answers read lazily (see
`send_deferred`).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from typing import Any

from shardcache.errors import DaemonUnavailable, error_for_status

JSON_HEADERS = {"Content-Type": "application/json"}

# A keep-alive connection the server closed shows up as one of these when it is next used; the request never
# reached the daemon, so sending it again on a fresh connection is safe.
_STALE_CONNECTION = (
    http.client.RemoteDisconnected,
    http.client.CannotSendRequest,
    http.client.ResponseNotReady,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)


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

    def json(self) -> Any:
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


class _ThreadConnection:
    """One thread's keep-alive connection and, at most, one deferred answer still to be read on it."""

    __slots__ = ("conn", "pending")

    def __init__(self, conn: UnixHTTPConnection) -> None:
        self.conn = conn
        self.pending = False


class Transport:
    """Keep-alive HTTP over a Unix socket, safe across threads and forks.

    Args:
        socket_path: the daemon's Unix socket.
        timeout: seconds a request may take (an open that misses waits for the download).
    """

    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._pid = os.getpid()
        self._local = threading.local()

    def _slot(self) -> _ThreadConnection:
        pid = os.getpid()
        if pid != self._pid:
            # Forked child: the inherited sockets belong to the parent. Drop them unread and unclosed
            # (closing is harmless, but reading or writing would steal or corrupt the parent's answers).
            self._pid = pid
            self._local = threading.local()
        slot: _ThreadConnection | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = _ThreadConnection(UnixHTTPConnection(self.socket_path, self.timeout))
            self._local.slot = slot
        return slot

    def _drain(self, slot: _ThreadConnection) -> None:
        """Read a deferred answer so the connection is free; its outcome no longer matters to anyone."""
        if not slot.pending:
            return
        slot.pending = False
        try:
            slot.conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            slot.conn.close()

    def request(self, method: str, path: str, body: Any = None) -> Response:
        """Send one request and read the whole answer.

        Raises:
            DaemonUnavailable: the socket is missing, refuses, or the connection broke twice.
        """
        payload = None if body is None else json.dumps(body).encode()
        headers = JSON_HEADERS if payload is not None else {}
        slot = self._slot()
        self._drain(slot)
        for attempt in (0, 1):
            conn = slot.conn
            fresh = conn.sock is None
            try:
                conn.request(method, path, payload, headers)
                answer = conn.getresponse()
                return Response(answer.status, answer.read())
            except _STALE_CONNECTION as exc:
                conn.close()
                if fresh or attempt == 1:
                    raise DaemonUnavailable(self.socket_path, f"connection lost ({exc!r})") from exc
            except TimeoutError as exc:
                conn.close()
                raise DaemonUnavailable(self.socket_path, f"no answer within {conn.timeout}s") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise DaemonUnavailable(self.socket_path, _describe(exc)) from exc
        raise AssertionError("unreachable")

    def send_deferred(self, method: str, path: str, body: Any) -> None:
        """Send a request whose answer nobody waits for; it is read before this thread's next request.

        Used for lease releases: the daemon gets the release at once, but the reader does not sit through a
        round trip for a 204 it has no use for. Failures are ignored (an unreleased lease expires).
        """
        payload = json.dumps(body).encode()
        slot = self._slot()
        self._drain(slot)
        try:
            slot.conn.request(method, path, payload, JSON_HEADERS)
            slot.pending = True
        except (OSError, http.client.HTTPException):
            slot.conn.close()

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
            raise DaemonUnavailable(self.socket_path, _describe(exc)) from exc

    def probe(self, path: str, timeout: float) -> Response:
        """One request on a throwaway connection with a short timeout: is anyone answering right now?"""
        conn = UnixHTTPConnection(self.socket_path, timeout)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return Response(answer.status, answer.read())
        except (OSError, http.client.HTTPException) as exc:
            raise DaemonUnavailable(self.socket_path, _describe(exc)) from exc
        finally:
            conn.close()

    def close(self) -> None:
        """Close this thread's connection (reading a deferred answer first). Other threads close on exit."""
        slot: _ThreadConnection | None = getattr(self._local, "slot", None)
        if slot is None or os.getpid() != self._pid:
            return
        self._drain(slot)
        slot.conn.close()
        self._local.slot = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "the socket does not exist"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (the daemon is not running)"
    if isinstance(exc, PermissionError):
        return "permission denied (join the daemon's group or check the socket's mode)"
    return f"{type(exc).__name__}: {exc}"
