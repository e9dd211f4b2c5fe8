"""Helpers of the daemon's integration tests: the cache directory's files, and a throttling/faulty TCP proxy
in front of the S3 endpoint (failures are injected there, not by patching)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from shardcached.storage import LOCK_NAME


def files_in(cache_dir: Path) -> list[str]:
    """The cache directory's files, but for the daemon's lock file (there while any daemon ran on it)."""
    return sorted(p.name for p in cache_dir.iterdir() if p.name != LOCK_NAME) if cache_dir.exists() else []


class Proxy:
    """A TCP proxy on 127.0.0.1 that can throttle bandwidth and drop the first connections.

    `rate` limits bytes per second from the upstream per connection; the first `fail_first` connections
    are answered `503 Slow Down` and closed (a transient fault the daemon must retry). `bytes_down` counts
    what the upstream sent through it (answers, headers included).
    """

    def __init__(self, upstream: str, rate: float | None = None, fail_first: int = 0) -> None:
        host, port = upstream.rsplit("//", 1)[-1].split(":")
        self.upstream = (host, int(port))
        self.rate = rate
        self.fail_first = fail_first
        self.connections = 0
        self.bytes_down = 0
        self._count_lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            if self.connections <= self.fail_first:
                threading.Thread(target=self._refuse, args=(client,), daemon=True).start()
                continue
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.rate, True), daemon=True).start()

    @staticmethod
    def _refuse(client: socket.socket) -> None:
        try:
            client.recv(65536)
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            head = f"HTTP/1.1 503 Slow Down\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            client.sendall(head.encode() + body)
        except OSError:
            pass
        finally:
            client.close()

    def _pipe(self, src: socket.socket, dst: socket.socket, rate: float | None, count: bool = False) -> None:
        started, sent = time.monotonic(), 0
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                sent += len(data)
                if count:
                    with self._count_lock:
                        self.bytes_down += len(data)
                if rate:
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)  # throttling the stream, not waiting for readiness
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def env(self) -> dict[str, str]:
        """Environment pointing the daemon's S3 client at this proxy."""
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ENDPOINT_URL": self.endpoint}
