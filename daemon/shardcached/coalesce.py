"""One socket write per small HTTP answer: uvicorn's httptools protocol with a write-coalescing transport.

uvicorn writes an answer's status line and headers in one `transport.write` and its body in another, and
uvloop sends each at once: two syscalls, and on a loaded node two wake-ups of the client, which reads the
headers, finds no body and sleeps again. On the open hot path (a few hundred bytes per answer) that doubled
the daemon's time in `send` and the clients' context switches. Small writes are held until the end of
the current loop step (`call_soon`) and sent together; a large write (a streamed shard) flushes whatever
is held and goes out at once, so uvicorn's flow control still sees the real transport's buffer.

The protocol also reads the connected process's pid once per connection (`SO_PEERCRED`, peers.py) and
puts it in every request's scope under `peers.PEER_SCOPE_KEY`: leases and plans of requests that name no
session belong to that process, and a session's job is named after it.
uvicorn has no hook for a connection's credentials; `on_message_begin` is where it builds the scope, and
tests/daemon/test_peer_leases.py fails if the pid stops arriving.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shardcached.peers import PEER_SCOPE_KEY, peer_pid

SMALL_WRITE = 16 * 1024  # larger writes are not held back


class CoalescingTransport:
    """Delegates to `transport`, holding small writes until the end of the current loop step."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= SMALL_WRITE:
            self.flush()
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes >= SMALL_WRITE:
            self.flush()

    def flush(self) -> None:
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CoalescingTransport`, telling the peer's pid."""

    peer: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.peer = peer_pid(transport)
        wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[PEER_SCOPE_KEY] = self.peer  # type: ignore[literal-required]
