"""The open's answer reaches the client as the typed `OpenGrant` of the wire contract.

One test against the real daemon; one against a stand-in that answers the open with a body that is not a
grant (a daemon of another version), which only a hand-made server on a Unix socket can do.
"""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import DaemonError
from shardcache_protocol import SESSIONS_PATH, OpenGrant


class _NotAGrant(http.server.BaseHTTPRequestHandler):
    """A daemon of another version: without sessions (404), and with an open answer that is no grant."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == SESSIONS_PATH:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"path": "/somewhere", "lease": 7}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        request, _ = super().get_request()
        return request, ("local", 0)  # BaseHTTPRequestHandler expects a (host, port) client address


@pytest.fixture
def not_a_grant_socket(short_tmp: Path) -> Iterator[str]:
    path = str(short_tmp / "other.sock")
    server = _UnixHTTPServer(path, _NotAGrant)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()


def test_an_open_through_the_daemon_is_granted_as_an_open_grant(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards: ShardSet
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    path = local_shards.local_paths[0]
    with DaemonClient(daemon.socket, required=True) as client:
        grant = client._acquire(path, None, None, None)
        assert isinstance(grant, OpenGrant)
        assert (grant.size, grant.hit) == (Path(path).stat().st_size, False)
        assert Path(grant.path).read_bytes() == Path(path).read_bytes()
        client._release(grant.lease, 0.0)


def test_an_answer_that_is_not_a_grant_raises_naming_the_url(not_a_grant_socket: str) -> None:
    url = "s3://bucket/shard-000001.tar"
    with (
        DaemonClient(not_a_grant_socket, required=True) as client,
        pytest.raises(DaemonError, match=r"open of s3://bucket/shard-000001\.tar.*same shardcache version"),
        client.open(url),
    ):
        pass
