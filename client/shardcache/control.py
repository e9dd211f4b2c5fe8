"""The client's control plane to the daemon: httpx over the Unix socket, for requests where latency does not
matter (plans, stats, listings, prefetch, evict, telemetry, health probes).

The open/release hot path uses the hand-written keep-alive transport (`shardcache.transport`) instead:
`bench/bench_open_latency.py` measures httpx there at 25-30 times its latency (p50 and p99, 16 processes on
two cores; the figures are in `shardcache.transport`'s docstring). Everything else goes through httpx, which
is well kept and complete (chunked bodies, timeouts, connection pooling), so the hand-written code stays as
small as the hot path needs.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from shardcache.errors import DaemonUnavailable
from shardcache.transport import Response, describe

if TYPE_CHECKING:
    import httpx

BASE_URL = "http://shardcached"


class ControlClient:
    """httpx requests to the daemon on `socket_path`; safe across threads and forks.

    httpx is imported on first use, so importing the client (and every DataLoader worker that only opens
    shards) does not pay for it. A forked child makes its own httpx client: the parent's pooled
    connections are never used by two processes.

    Args:
        socket_path: the daemon's Unix socket (may be changed later; the next request follows it).
        timeout: seconds a request may take unless the call gives its own.
    """

    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._owner: tuple[int, str] | None = None  # (pid, socket) the client was made for

    def _http(self) -> httpx.Client:
        owner = (os.getpid(), self.socket_path)
        client = self._client
        if client is not None and self._owner == owner:
            return client
        import httpx

        with self._lock:
            if self._client is None or self._owner != owner:
                if self._client is not None and self._owner is not None and self._owner[0] == owner[0]:
                    self._client.close()  # the socket moved (discovery); a forked child drops it unclosed
                transport = httpx.HTTPTransport(uds=self.socket_path)
                self._client = httpx.Client(transport=transport, base_url=BASE_URL, timeout=self.timeout)
                self._owner = owner
            return self._client

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """Send one request and read its whole answer.

        Raises:
            DaemonUnavailable: the socket is missing, refuses, or no answer came within the timeout.
        """
        import httpx

        try:
            answer = self._http().request(
                method, path, json=body, headers=headers, timeout=self.timeout if timeout is None else timeout
            )
        except httpx.TimeoutException as exc:
            raise DaemonUnavailable(
                self.socket_path, f"no answer within {timeout or self.timeout:g}s"
            ) from exc
        except httpx.TransportError as exc:
            raise DaemonUnavailable(self.socket_path, describe(_root_cause(exc))) from exc
        return Response(answer.status_code, answer.content)

    def close(self) -> None:
        """Close this process's pooled connections."""
        with self._lock:
            client, self._client = self._client, None
            owner, self._owner = self._owner, None
        if client is not None and owner is not None and owner[0] == os.getpid():
            client.close()


def _root_cause(exc: BaseException) -> BaseException:
    """The OSError under httpx's wrapping (FileNotFoundError, ConnectionRefusedError, ...), else `exc`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc
