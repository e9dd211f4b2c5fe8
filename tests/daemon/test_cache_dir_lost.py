"""`rm -rf` of the whole cache directory under a running daemon: noticed, never blamed on the remote.

The daemon recreates the directory and fetches shards again; while it cannot (the path is now a file),
`/v1/health` answers 503 naming the path and opens answer 503 `cache_dir_missing`. The one-daemon lock
survives the removal, so a second daemon on the same path still refuses to start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from harness.daemon_api import api, metric
from harness.polling import wait_for
from shardcache import DaemonClient
from tests.daemon.test_cache_dir_lock import second_daemon


def test_opens_after_rm_rf_of_the_cache_dir_fetch_again_and_never_blame_the_remote(
    daemon_factory, local_shards
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    urls = local_shards.local_paths
    with api(daemon) as http:
        for url in urls:
            grant = http.post("/v1/shards/open", json={"url": url}).json()
            http.post("/v1/shards/release", json={"lease": grant["lease"]})
        shutil.rmtree(daemon.cache_dir)
        answers = [http.post("/v1/shards/open", json={"url": url}) for url in urls]
        errors = [a.json() for a in answers if a.status_code != 200]
        assert errors == [], errors
        for url, answer in zip(urls, answers, strict=True):
            assert Path(answer.json()["path"]).read_bytes() == Path(url).read_bytes()
        assert http.get("/v1/health").status_code == 200
    assert daemon.cache_dir.is_dir()
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="not_found"') == 0
    assert metric(daemon, "shardcache_cache_dir_losses_total") == 1


def test_a_cache_dir_that_cannot_be_recreated_fails_health_naming_the_path(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    url = local_shards.local_paths[0]
    health_url = daemon.metrics_url.replace("/metrics", "/v1/health")
    shutil.rmtree(daemon.cache_dir)
    daemon.cache_dir.write_bytes(b"not a directory")  # mkdir there fails until it is removed
    with api(daemon) as http:
        wait_for(lambda: http.get("/v1/health").status_code == 503, "health to fail after rm -rf", 15)
        answer = http.get("/v1/health")
        assert str(daemon.cache_dir) in answer.json()["detail"]
        tcp = httpx.get(health_url, timeout=10)
        assert tcp.status_code == 503 and str(daemon.cache_dir) in tcp.json()["detail"]
        refused = http.post("/v1/shards/open", json={"url": url})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "cache_dir_missing"
        assert str(daemon.cache_dir) in refused.json()["detail"]

        daemon.cache_dir.unlink()  # the operator fixes it: the daemon recreates the directory
        wait_for(lambda: http.get("/v1/health").status_code == 200, "health back", 15)
        assert http.post("/v1/shards/open", json={"url": url}).status_code == 200
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="not_found"') == 0


def test_a_second_daemon_on_the_same_path_after_rm_rf_still_exits(
    daemon_factory, local_shards, short_tmp: Path, tmp_path: Path
):
    cache = tmp_path / "cache"
    first = daemon_factory(allow=[str(local_shards.local_dir)], cache_dir=cache)
    shutil.rmtree(cache)
    run = second_daemon(cache, short_tmp / "second.sock", str(local_shards.local_dir))
    assert run.returncode == 1, run.stderr
    assert str(cache) in run.stderr and f"pid {first.process.pid}" in run.stderr
    assert first.healthy()


def test_a_client_reads_directly_while_the_cache_dir_cannot_be_recreated(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    url = local_shards.local_paths[0]
    shutil.rmtree(daemon.cache_dir)
    daemon.cache_dir.write_bytes(b"not a directory")
    with api(daemon) as http:
        wait_for(lambda: http.get("/v1/health").status_code == 503, "health to fail after rm -rf", 15)
    with DaemonClient(daemon.socket) as client, client.open(url) as handle:
        assert handle.read() == Path(url).read_bytes()
