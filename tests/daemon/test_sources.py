"""Shards from local paths, file:// URLs and plain HTTP servers, beside S3."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.daemon_api import api


@pytest.fixture
def http_root(local_shards) -> Iterator[str]:
    """A plain HTTP server (no Range support, no ETag) serving the local shards' directory."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(local_shards.local_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_shards_come_from_an_http_server(daemon_factory, local_shards, http_root):
    daemon = daemon_factory(allow=[http_root])
    with api(daemon) as http_api:
        answers = [
            http_api.post("/v1/shards/open", json={"url": f"{http_root}/{name}"}).json()
            for name in local_shards.names
        ]
        missing = http_api.post("/v1/shards/open", json={"url": f"{http_root}/missing.tar"})
    for answer, local in zip(answers, local_shards.local_paths, strict=True):
        assert Path(answer["path"]).read_bytes() == Path(local).read_bytes()
    assert missing.status_code == 404


def test_local_paths_and_file_urls_name_the_same_shard(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    path = local_shards.local_paths[0]
    with api(daemon) as http_api:
        first = http_api.post("/v1/shards/open", json={"url": path}).json()
        second = http_api.post("/v1/shards/open", json={"url": f"file://{path}"}).json()
    assert (first["hit"], second["hit"]) == (False, True)
    assert first["path"] == second["path"]
    assert Path(first["path"]).read_bytes() == Path(path).read_bytes()


def test_a_changed_local_file_is_fetched_again(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--revalidate-after-s", "0.001"])
    path = Path(local_shards.local_paths[0])
    with api(daemon) as http_api:
        before = http_api.post("/v1/shards/open", json={"url": str(path)}).json()
        path.write_bytes(b"new contents")
        after = http_api.post("/v1/shards/open", json={"url": str(path)}).json()
    assert after["hit"] is False
    assert Path(after["path"]).read_bytes() == b"new contents"
    assert before["path"] != after["path"]
