"""An operator's hands in the cache directory: a cache file removed or truncated is dropped and fetched again.

Each test goes through the real daemon and the real client, as a trainer would: open, read the bytes,
compare them with the remote object.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.daemon_api import api, metric
from shardcache import DaemonClient


def _read_through(client: DaemonClient, url: str) -> bytes:
    with client.open(url) as shard:
        return shard.read()


def test_every_open_after_an_operator_removes_a_cache_file_gets_the_shard(daemon_factory, local_shards):
    url = local_shards.local_paths[0]
    original = Path(url).read_bytes()
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with DaemonClient(daemon.socket, required=True) as client, api(daemon) as http:
        assert _read_through(client, url) == original
        # Another reader of the node holds a lease on the shard (a trainer between open and read).
        http.post("/v1/shards/open", json={"url": url}).raise_for_status()
        (cached,) = [p for p in daemon.cache_dir.glob("*.tar")]
        cached.unlink()  # what `rm <cache>/<key>.tar` does
        failures = []
        for attempt in range(10):
            try:
                assert _read_through(client, url) == original
            except Exception as exc:  # counted, then reported all at once
                failures.append(f"open {attempt}: {type(exc).__name__}: {exc}")
    assert failures == [], f"{len(failures)} of 10 opens failed after rm of the cache file: {failures[:2]}"
    assert cached.stat().st_size == len(original)  # fetched again into the cache
    assert metric(daemon, "shardcache_evictions_total", 'reason="invalid"') == 1


def test_a_truncated_cache_file_is_fetched_again_not_handed_out(daemon_factory, local_shards):
    url = local_shards.local_paths[1]
    original = Path(url).read_bytes()
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with DaemonClient(daemon.socket, required=True) as client:
        assert _read_through(client, url) == original
        (cached,) = [p for p in daemon.cache_dir.glob("*.tar")]
        os.truncate(cached, len(original) // 2)
        assert _read_through(client, url) == original
        assert client.stream(url).read() == original


def test_evict_works_on_a_shard_whose_file_an_operator_removed(daemon_factory, local_shards):
    url = local_shards.local_paths[2]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with api(daemon) as http:
        grant = http.post("/v1/shards/open", json={"url": url}).json()
        Path(grant["path"]).unlink()
        # The trainer cannot open the path and streams instead, its lease still held.
        assert http.get("/v1/shards/data", params={"url": url}).content == Path(url).read_bytes()
    evicted = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "--socket", daemon.socket, "evict", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert evicted.returncode == 0, evicted.stdout + evicted.stderr
    with api(daemon) as http:
        assert http.get("/v1/shards").json()["shards"] == []
        http.post("/v1/shards/release", json={"lease": grant["lease"]})
        reopened = http.post("/v1/shards/open", json={"url": url}).json()
    assert reopened["hit"] is False and Path(reopened["path"]).read_bytes() == Path(url).read_bytes()
