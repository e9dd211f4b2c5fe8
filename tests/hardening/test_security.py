"""Security properties of the running daemon: who may connect, what a hostile URL may reach, and what a
planted file in the cache directory may expose (docs/security.md explains each)."""

from __future__ import annotations

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from harness.daemon_api import api
from shardcached.keys import cache_key


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Serves /pub/* (or redirects it elsewhere) and records every request it gets."""

    seen: list[str]
    redirect_to: str | None
    body = b"shard-bytes" * 100

    def _answer(self, with_body: bool) -> None:
        self.seen.append(f"{self.command} {self.path}")
        if self.redirect_to is not None:
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        if with_body:
            self.wfile.write(self.body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's handler names
        self._answer(True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def log_message(self, *args: object) -> None:
        pass


def serve(redirect_to: str | None) -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "redirect_to": redirect_to})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def metadata_and_redirector() -> Iterator[tuple[str, list[str], str, list[str]]]:
    """A stand-in for a cloud metadata endpoint, and an allow-listed server that redirects to it."""
    metadata, metadata_seen = serve(None)
    target = f"http://127.0.0.1:{metadata.server_address[1]}/latest/meta-data/iam/security-credentials/role"
    redirector, redirector_seen = serve(target)
    try:
        yield f"http://127.0.0.1:{redirector.server_address[1]}", redirector_seen, target, metadata_seen
    finally:
        for server in (metadata, redirector):
            server.shutdown()
            server.server_close()


def test_the_socket_is_0660_and_other_users_cannot_connect(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(13)\n"
    )
    # The venv's interpreter lives where nobody may not enter; the system one runs as any user.
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    other = subprocess.run([python, "-c", probe, daemon.socket], user=65534, group=65534, check=False)
    assert other.returncode == 13, "user nobody could connect to the daemon's socket"


def test_urls_outside_the_allow_list_are_refused_before_any_remote_is_contacted(
    daemon_factory, local_shards, metadata_and_redirector
):
    base, seen, metadata_url, metadata_seen = metadata_and_redirector
    daemon = daemon_factory(allow=[f"{base}/pub", str(local_shards.local_dir)])
    hostile = [
        metadata_url,
        "http://169.254.169.254/latest/meta-data/",
        f"{base}/pub/../private/x.tar",
        f"{base}/pub/%2e%2e/private/x.tar",
        f"{local_shards.local_dir}/../../etc/passwd",
        "file:///etc/passwd",
        "/etc/shadow",
    ]
    with api(daemon) as http:
        statuses = {url: http.post("/v1/shards/open", json={"url": url}).status_code for url in hostile}
    assert set(statuses.values()) <= {400, 403}, statuses
    assert seen == [] and metadata_seen == []


def test_an_allowed_server_cannot_redirect_the_daemon_to_a_metadata_endpoint(
    daemon_factory, metadata_and_redirector
):
    base, seen, _, metadata_seen = metadata_and_redirector
    daemon = daemon_factory(allow=[f"{base}/pub"], extra_args=["--retries", "0"])
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": f"{base}/pub/x.tar"})
    assert seen, "the allowed server was never asked"
    assert metadata_seen == [], f"the daemon followed a redirect to the metadata endpoint: {metadata_seen}"
    assert answer.status_code >= 400


def test_a_symlink_planted_in_the_cache_dir_is_not_served(daemon_factory, local_shards, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"private key material\n")
    url = local_shards.local_paths[0]
    key = cache_key(url, "planted")
    cache = tmp_path / "planted-cache"
    cache.mkdir()
    os.symlink(secret, cache / f"{key}.tar")
    meta = {
        "url": url,
        "version": "planted",
        "size": secret.stat().st_size,
        "checksum": None,
        "file": f"{key}.tar",
    }
    (cache / f"{key}.meta.json").write_text(json.dumps(meta))
    daemon = daemon_factory(
        allow=[str(local_shards.local_dir)], cache_dir=cache, extra_args=["--revalidate-after-s", "0"]
    )
    with api(daemon) as http:
        streamed = http.get("/v1/shards/data", params={"url": url}).content
    assert streamed != secret.read_bytes()


def test_the_daemon_never_writes_outside_its_cache_directory(daemon_factory, local_shards, tmp_path):
    cache = tmp_path / "only-here"
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], cache_dir=cache)
    before = {p: p.stat().st_mtime_ns for p in local_shards.local_dir.iterdir()}
    with api(daemon) as http:
        for url in local_shards.local_paths:
            http.post("/v1/shards/open", json={"url": url}).raise_for_status()
        http.delete("/v1/shards", params={"url": f"{local_shards.local_dir}/../../etc/passwd"})
        http.delete("/v1/shards", params={"url": local_shards.local_paths[0]})
    assert {p: p.stat().st_mtime_ns for p in local_shards.local_dir.iterdir()} == before
    assert all(p.parent == cache for p in cache.iterdir())
