"""A daemon restart while a streamed handoff (`GET /v1/shards/data`) starts is waited out like one during
an open (`restart_wait_s`); an `auto` client whose daemon does not come back reads the shard directly.

The failure is injected through the client's transport, at the moment the stream starts: it stops the real
daemon (SIGTERM, a graceful exit) and starts a new one on the same socket, or answers the 503
shutting_down a stopping daemon sends.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.open_wire import CountingTransport


class FailingFirstStream(CountingTransport):
    """The client's own transport, except that it runs `before_first` when the first stream starts (which
    can answer that stream itself)."""

    def __init__(self, client: DaemonClient, before_first: Callable[[], http.client.HTTPResponse | None]):
        super().__init__(client.socket, client.timeout)
        self.before_first = before_first
        self.streams = 0

    def stream(self, path: str) -> http.client.HTTPResponse:
        self.streams += 1
        if self.streams == 1:
            answer = self.before_first()
            if answer is not None:
                return answer
        return super().stream(path)


def streaming_client(socket_path: str, **options: object) -> DaemonClient:
    return DaemonClient(socket_path, handoff="stream", **options)  # type: ignore[arg-type]


def read(client: DaemonClient, url: str) -> bytes:
    with client.open(url) as shard:
        return shard.read()


def shutting_down_answer() -> http.client.HTTPResponse:
    """The answer a stopping daemon gives a request whose download it cancels."""
    body = json.dumps({"error": "shutting_down", "detail": "the daemon is shutting down"}).encode()
    ours, theirs = socket.socketpair()
    with theirs:
        theirs.sendall(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
    answer = http.client.HTTPResponse(ours)
    ours.close()  # the answer's file keeps the socket open until it is closed
    answer.begin()
    return answer


def test_a_stream_that_finds_the_daemon_restarting_waits_for_the_new_one(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards, tmp_path: Path
) -> None:
    allow = [str(local_shards.local_dir)]
    daemon = daemon_factory(allow=allow)
    again = threading.Thread(
        target=lambda: daemon_factory(allow=allow, socket_path=Path(daemon.socket), cache_dir=tmp_path / "b")
    )

    def restart() -> None:
        daemon.stop()  # graceful: returns once the process has exited and its socket is gone
        again.start()  # the stream finds no socket and waits for this daemon

    client = streaming_client(daemon.socket, restart_wait_s=60)
    client._transport = transport = FailingFirstStream(client, restart)
    path = local_shards.local_paths[0]
    assert read(client, path) == Path(path).read_bytes()
    again.join()
    assert transport.streams == 2
    assert client.stats().misses == 1  # the new daemon (an empty cache) streamed it, not a direct read


def test_a_stream_answered_shutting_down_is_sent_again(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = streaming_client(daemon.socket, required=True, restart_wait_s=60)
    client._transport = transport = FailingFirstStream(client, shutting_down_answer)
    path = local_shards.local_paths[0]
    assert read(client, path) == Path(path).read_bytes()
    assert transport.streams == 2


def test_an_auto_client_reads_directly_when_the_daemon_stops_for_good_as_a_stream_starts(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])

    def stop() -> None:
        daemon.stop()

    client = streaming_client(daemon.socket, restart_wait_s=0.3)
    client._transport = transport = FailingFirstStream(client, stop)
    caplog.set_level(logging.WARNING, logger="shardcache")
    path = local_shards.local_paths[0]
    assert read(client, path) == Path(path).read_bytes()
    assert transport.streams == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "did not come back within 0.3s" in warning
