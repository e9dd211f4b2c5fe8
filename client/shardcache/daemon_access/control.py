"""The client's control plane to the daemon: httpx over the Unix socket, for requests where latency does not
matter (plans, stats, listings, prefetch, evict, telemetry, health probes).

The open/release hot path uses the hand-written keep-alive transport (`transport`) instead:
`bench/bench_open_latency.py` measures httpx there at 25-30 times its latency (p50 and p99, 16 processes on
two cores; the figures are in `transport`'s docstring). Everything else goes through httpx, which
is well kept and complete (chunked bodies, timeouts, connection pooling), so the hand-written code stays as
small as the hot path needs.

Fork safety (see `shardcache.forksafe`): httpx, httpcore and certifi are imported here, when `shardcache` is
imported, never inside a request a DataLoader worker makes; httpx gets `NO_TLS`, one TLS context built at
import, so no transport builds one (the socket speaks plain HTTP); proxies from the environment are
ignored (`trust_env=False`: they would build TLS contexts too, and a Unix socket never goes through a
proxy); a forked child drops the parent's lock and pooled client (`_reset_after_fork`).
"""

from __future__ import annotations

import os
import ssl
import threading

import certifi  # noqa: F401  (imported by httpx's create_ssl_context on every transport: see above)
import httpcore  # noqa: F401  (imported lazily by httpx.HTTPTransport: see above)
import httpx

from shardcache import forksafe
from shardcache.daemon_access.transport import Response, check_descriptors, describe
from shardcache.errors import DaemonUnavailable

BASE_URL = "http://shardcached"
# Never used for a handshake (the control plane is plain HTTP over a Unix socket); it exists so that httpx
# builds none, and it is built here, in the importing thread, before any DataLoader forks.
NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class ControlClient:
    """httpx requests to the daemon on `socket_path`; safe across threads and forks.

    A forked child makes its own httpx client: the parent's pooled connections (and their locks) are never
    used by two processes.

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
        forksafe.reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # The parent's lock may be held by a thread that does not exist here; its pooled client is dropped
        # unclosed (closing would shut the parent's connections).
        self._lock = threading.Lock()
        self._client = None
        self._owner = None

    def _http(self) -> httpx.Client:
        owner = (os.getpid(), self.socket_path)
        client = self._client
        if client is not None and self._owner == owner:
            return client
        with self._lock:
            if self._client is None or self._owner != owner:
                if self._client is not None and self._owner is not None and self._owner[0] == owner[0]:
                    self._client.close()  # the socket moved (discovery); a forked child drops it unclosed
                transport = httpx.HTTPTransport(uds=self.socket_path, verify=NO_TLS, trust_env=False)
                self._client = httpx.Client(
                    transport=transport, base_url=BASE_URL, timeout=self.timeout, trust_env=False
                )
                self._owner = owner
            return self._client

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
    ) -> Response:
        """Send one request and read its whole answer: `body` as JSON, or `content` as it is.

        Raises:
            DaemonUnavailable: the socket is missing, refuses, or no answer came within the timeout.
        """
        try:
            answer = self._http().request(
                method,
                path,
                json=body,
                content=content,
                headers=headers,
                timeout=self.timeout if timeout is None else timeout,
            )
        except httpx.TimeoutException as exc:
            raise DaemonUnavailable(
                self.socket_path, f"no answer within {timeout or self.timeout:g}s"
            ) from exc
        except httpx.TransportError as exc:
            check_descriptors(_root_cause(exc))
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
