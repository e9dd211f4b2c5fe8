"""kill -9 and SIGTERM in the middle of downloads: nothing partial is ever served or left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from harness.daemon_api import api
from harness.devservers import Daemon, free_tcp_port
from harness.polling import wait_for
from tests.daemon.daemon_helpers import Proxy, files_in

TEMP_PREFIX = ".tmp-"
SMALL_CHUNKS = {"SHARDCACHE_CHUNK_BYTES": str(64 * 1024)}  # so a temp file grows while we look


def _open_in_background(daemon: Daemon, urls: list[str]) -> list[threading.Thread]:
    def open_one(url: str) -> None:
        try:
            with api(daemon) as http:
                http.post("/v1/shards/open", json={"url": url})
        except httpx.HTTPError:
            pass  # the daemon goes away under it

    threads = [threading.Thread(target=open_one, args=(url,), daemon=True) for url in urls]
    for thread in threads:
        thread.start()
    return threads


def _downloading(daemon: Daemon) -> bool:
    return any(
        name.startswith(TEMP_PREFIX) and (daemon.cache_dir / name).stat().st_size > 0
        for name in files_in(daemon.cache_dir)
    )


def test_kill_9_during_fetches_keeps_completed_shards_and_serves_nothing_partial(
    make_bucket, daemon_factory, s3_server, tmp_path
):
    shards = make_bucket(count=3, samples=32, payload_bytes=32 * 1024)
    cache = tmp_path / "crash-cache"
    allow = [f"s3://{shards.bucket}"]
    with Proxy(s3_server.endpoint, rate=256 * 1024) as slow:
        daemon = daemon_factory(allow=allow, cache_dir=cache, env={**slow.env, **SMALL_CHUNKS})
        with api(daemon) as http:
            http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).raise_for_status()
        threads = _open_in_background(daemon, shards.s3_urls[1:])
        wait_for(lambda: _downloading(daemon), "downloads to be in progress")
        daemon.kill()
        for thread in threads:
            thread.join(30)
    restarted = daemon_factory(allow=allow, cache_dir=cache)
    assert not [name for name in files_in(cache) if name.startswith(TEMP_PREFIX)]
    with api(restarted) as http:
        answers = [http.post("/v1/shards/open", json={"url": url}).json() for url in shards.s3_urls]
    assert [a["hit"] for a in answers] == [True, False, False]
    for answer, local in zip(answers, shards.local_paths, strict=True):
        assert Path(answer["path"]).read_bytes() == Path(local).read_bytes()


def test_sigterm_during_a_fetch_exits_0_removes_the_socket_and_publishes_nothing_partial(
    make_bucket, daemon_factory, s3_server
):
    shards = make_bucket(count=1, samples=32, payload_bytes=32 * 1024)
    with Proxy(s3_server.endpoint, rate=256 * 1024) as slow:
        daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], env={**slow.env, **SMALL_CHUNKS})
        threads = _open_in_background(daemon, shards.s3_urls)
        wait_for(lambda: _downloading(daemon), "the download to be in progress")
        assert daemon.stop() == 0
        for thread in threads:
            thread.join(30)
    assert not os.path.exists(daemon.socket)
    # S3 serves ranges: the bytes received are kept, fsynced, as a partial file for the next daemon to
    # resume (tests/daemon/test_resume.py); no temp file, and nothing published.
    assert [name for name in files_in(daemon.cache_dir) if not name.startswith(".part-")] == []


def test_a_socket_left_by_a_killed_daemon_is_replaced_at_restart(daemon_factory, local_shards):
    first = daemon_factory(allow=[str(local_shards.local_dir)])
    first.kill()
    assert os.path.exists(first.socket)
    second = daemon_factory(allow=[str(local_shards.local_dir)], socket_path=Path(first.socket))
    assert second.healthy()


def test_a_second_daemon_on_a_live_socket_refuses_to_start(daemon_factory, local_shards, tmp_path):
    first = daemon_factory(allow=[str(local_shards.local_dir)])
    args = ["--socket", first.socket, "--cache-dir", str(tmp_path / "other"), "--capacity", "1MiB"]
    args += ["--metrics-addr", f"127.0.0.1:{free_tcp_port()}"]
    second = subprocess.run(
        [sys.executable, "-m", "shardcached", *args], capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 1
    assert "already listens" in second.stderr
    assert first.healthy()
