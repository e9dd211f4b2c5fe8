"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, put between the daemon and the S3 endpoint.

The daemon is pointed at it with `AWS_ENDPOINT_URL_S3`; it forwards each request to the upstream and can,
per request, answer or damage the response instead. Faults are chosen by a schedule the test sets on the
live object (a thread-safe queue per object key, or a permanent rule), so every test says exactly which
requests fail and how:

- `"503"` / `"500"`: an S3-style error answer, the upstream is not asked (a 5xx burst is several of them);
- `"reset"`: the real status, headers and half the body, then a TCP reset (SO_LINGER 0);
- `"truncate"`: the real status and Content-Length but only half the body, then a clean close (FIN);
- `"stall"`: nothing at all for `stall_s` seconds (past the daemon's read timeout), then a close;
- `"trickle"`: the whole answer, in small pieces with pauses (a slow but healthy remote).

Hand-written rather than taken from a library because the faults live below HTTP (resets and truncation
mid-body with a correct Content-Length), which mitmproxy-style tools do not produce on demand, and it must
run inside the test process so tests can change the schedule and read the counters.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

FAULTS = ("503", "500", "reset", "truncate", "stall", "trickle")
ERRORS = ("503", "500", "reset", "truncate", "stall")  # the faults that make one attempt fail

_ERROR_BODY = {
    "503": b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    "500": b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>",
}
_REASON = {"503": "Slow Down", "500": "Internal Server Error"}


@dataclass
class Request:
    """One parsed client request: method, object key (path without the leading slash), raw bytes."""

    method: str
    key: str
    headers: dict[str, str]
    raw: bytes


@dataclass
class Counters:
    """What the proxy saw and did, for assertions."""

    requests: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    faults_by_key: collections.Counter[str] = field(default_factory=collections.Counter)

    def gets(self, key: str) -> int:
        """GET requests that reached the proxy for an object key (data downloads)."""
        return self.requests[("GET", key)]


class FaultProxy:
    """Forward HTTP to `upstream` and inject faults by schedule.

    Args:
        upstream: the real endpoint, `http://127.0.0.1:PORT`.
        stall_s: how long a `"stall"` holds the connection silent.
        trickle_bytes: piece size of a `"trickle"` answer.
        trickle_pause_s: pause between pieces of a `"trickle"` answer.
        methods: the request methods faults apply to (default data downloads only: GET).
    """

    def __init__(
        self,
        upstream: str,
        *,
        stall_s: float = 3.0,
        trickle_bytes: int = 4096,
        trickle_pause_s: float = 0.002,
        methods: tuple[str, ...] = ("GET",),
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.stall_s = stall_s
        self.trickle_bytes = trickle_bytes
        self.trickle_pause_s = trickle_pause_s
        self.methods = methods
        self.counters = Counters()
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[str]] = {}
        self._always: list[tuple[Callable[[str], bool], str]] = []
        self._stop = threading.Event()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(256)
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- the schedule -------------------------------------------------------------------------------------

    def schedule(self, key: str, faults: list[str]) -> None:
        """The next requests for object `key` (e.g. `bucket/shards/x.tar`) get `faults`, in order."""
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        with self._lock:
            self._queues.setdefault(key, collections.deque()).extend(faults)

    def always(self, fault: str, match: Callable[[str], bool]) -> None:
        """Every request whose key satisfies `match` gets `fault` (a permanently failing object)."""
        with self._lock:
            self._always.append((match, fault))

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()
            self._always.clear()

    def pending(self) -> int:
        """Scheduled faults not yet injected."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def _fault_for(self, request: Request) -> str | None:
        with self._lock:
            self.counters.requests[(request.method, request.key)] += 1
            if request.method not in self.methods:
                return None
            fault = next((f for match, f in self._always if match(request.key)), None)
            if fault is None:
                queue = self._queues.get(request.key)
                fault = queue.popleft() if queue else None
            if fault is not None:
                self.counters.faults[fault] += 1
                self.counters.faults_by_key[request.key] += 1
            return fault

    # -- serving ------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        upstream: socket.socket | None = None
        try:
            while not self._stop.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                fault = self._fault_for(request)
                if fault in _ERROR_BODY:
                    _send_error(client, fault)
                    continue
                if fault == "stall":
                    self._stop.wait(self.stall_s)  # the fault itself: a silent remote, not a readiness wait
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=30)
                    up_reader = upstream.makefile("rb")
                upstream.sendall(request.raw)
                head, body, close = _read_response(up_reader, request.method)
                if fault in ("reset", "truncate"):
                    client.sendall(head + body[: len(body) // 2])
                    if fault == "reset":
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault == "trickle":
                    data = head + body
                    for start in range(0, len(data), self.trickle_bytes):
                        client.sendall(data[start : start + self.trickle_bytes])
                        time.sleep(self.trickle_pause_s)  # the fault itself: a slow remote
                else:
                    client.sendall(head + body)
                if close:
                    return
        except OSError:
            return
        finally:
            reader.close()
            client.close()
            if upstream is not None:
                upstream.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()


def _read_request(reader: BinaryIO) -> Request | None:
    line = reader.readline(65537)
    if not line:
        return None
    raw = [line]
    headers: dict[str, str] = {}
    while True:
        header = reader.readline(65537)
        if not header:
            return None
        raw.append(header)
        if header in (b"\r\n", b"\n"):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = reader.read(length) if length else b""
    method, target = line.decode("latin-1").split()[:2]
    key = unquote(urlsplit(target).path).lstrip("/")
    return Request(method, key, headers, b"".join(raw) + body)


def _read_response(reader: BinaryIO, method: str) -> tuple[bytes, bytes, bool]:
    """(status line and headers, body, whether the connection closes after it)."""
    head = [reader.readline(65537)]
    if not head[0]:
        raise ConnectionResetError("upstream closed")
    status = int(head[0].split()[1])
    length: int | None = None
    chunked = close = False
    while True:
        header = reader.readline(65537)
        head.append(header)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif name == "connection":
            close = "close" in value.lower()
    if method == "HEAD" or status in (204, 304) or status < 200:
        body = b""
    elif chunked:
        parts = []
        while True:
            size_line = reader.readline(65537)
            parts.append(size_line)
            size = int(size_line.split(b";")[0], 16)
            parts.append(reader.read(size + 2))
            if size == 0:
                break
        body = b"".join(parts)
    elif length is not None:
        body = reader.read(length)
    else:
        body, close = reader.read(), True
    return b"".join(head), body, close


def _send_error(client: socket.socket, code: str) -> None:
    body = _ERROR_BODY[code]
    head = (
        f"HTTP/1.1 {code} {_REASON[code]}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    client.sendall(head.encode() + body)


def proxy_env(proxy: FaultProxy) -> dict[str, str]:
    """Environment that sends a daemon's S3 traffic through `proxy`."""
    return {"AWS_ENDPOINT_URL_S3": proxy.endpoint, "AWS_ENDPOINT_URL": proxy.endpoint}
