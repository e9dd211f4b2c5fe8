"""A download cut by a graceful restart resumes with ranged reads instead of starting over (S3 serves
ranges); a partial file is never served, and a remote object that changed meanwhile is fetched whole."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from harness.daemon_api import api
from harness.devservers import Daemon
from harness.polling import wait_for
from tests.daemon.daemon_helpers import Proxy, files_in

PART_PREFIX = ".part-"
SMALL_CHUNKS = {"SHARDCACHE_CHUNK_BYTES": str(64 * 1024)}  # the temp file grows while we look


def _open_in_background(daemon: Daemon, url: str) -> threading.Thread:
    def open_it() -> None:
        try:
            with api(daemon, timeout=120) as http:
                http.post("/v1/shards/open", json={"url": url})
        except httpx.HTTPError:
            pass  # the daemon goes away under it

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    return thread


def _received(cache: Path) -> int:
    """Bytes the download in flight has written so far."""
    return sum((cache / name).stat().st_size for name in files_in(cache) if name.startswith(".tmp-"))


def _cut_mid_download(daemon: Daemon, url: str, size: int, share: float = 0.3) -> int:
    """SIGTERM the daemon once `share` of the shard is in; returns the bytes its partial file kept."""
    thread = _open_in_background(daemon, url)
    wait_for(lambda: _received(daemon.cache_dir) > size * share, f"{share:.0%} of the shard to be downloaded")
    assert daemon.stop() == 0
    thread.join(30)
    names = files_in(daemon.cache_dir)
    partials = [name for name in names if name.startswith(PART_PREFIX)]
    assert len(partials) == 1 and [n for n in names if not n.startswith(PART_PREFIX)] == [], names
    return (daemon.cache_dir / partials[0]).stat().st_size


def test_a_download_cut_by_three_graceful_restarts_resumes_and_fetches_less_than_twice_the_shard(
    make_bucket, daemon_factory, s3_server, tmp_path
):
    shards = make_bucket(count=1, samples=16, payload_bytes=64 * 1024)  # ~1 MiB
    url, size = shards.s3_urls[0], shards.total_bytes
    cache = tmp_path / "cache"
    allow = [f"s3://{shards.bucket}"]
    # Slow enough that a busy machine cannot finish the download between the check and the SIGTERM.
    with Proxy(s3_server.endpoint, rate=128 * 1024) as slow:
        env = {**slow.env, **SMALL_CHUNKS}
        kept = []
        for share in (0.3, 0.55, 0.8):  # starting over each time would fetch 0.3 + 0.55 + 0.8 + 1 shards
            daemon = daemon_factory(allow=allow, cache_dir=cache, env=env)
            kept.append(_cut_mid_download(daemon, url, size, share))
        assert 0 < kept[0] <= kept[1] <= kept[2] <= size, kept
        restarted = daemon_factory(allow=allow, cache_dir=cache, env=env)
        with api(restarted) as http:
            listed = http.get("/v1/shards").json()["shards"]
            assert listed == []  # the partial file is not a shard
            answer = http.post("/v1/shards/open", json={"url": url})
            assert answer.status_code == 200, answer.text
        assert Path(answer.json()["path"]).read_bytes() == Path(shards.local_paths[0]).read_bytes()
        assert slow.bytes_down < 2 * size, (slow.bytes_down, size)
    assert [name for name in files_in(cache) if name.startswith((PART_PREFIX, ".tmp-"))] == []


def test_a_partial_download_of_an_object_that_changed_meanwhile_is_not_resumed(
    make_bucket, daemon_factory, s3_server, s3_client, tmp_path
):
    shards = make_bucket(count=1, samples=16, payload_bytes=64 * 1024)
    url, size = shards.s3_urls[0], shards.total_bytes
    cache = tmp_path / "cache"
    allow = [f"s3://{shards.bucket}"]
    # Slow enough that a busy machine cannot finish the download between the check and the SIGTERM.
    with Proxy(s3_server.endpoint, rate=128 * 1024) as slow:
        env = {**slow.env, **SMALL_CHUNKS}
        _cut_mid_download(daemon_factory(allow=allow, cache_dir=cache, env=env), url, size)
        replacement = bytes(reversed(Path(shards.local_paths[0]).read_bytes()))  # same size, new ETag
        s3_client.put_object(Bucket=shards.bucket, Key=url.split("/", 3)[3], Body=replacement)
        restarted = daemon_factory(allow=allow, cache_dir=cache, env=env)
        with api(restarted) as http:
            answer = http.post("/v1/shards/open", json={"url": url})
            assert answer.status_code == 200, answer.text
    assert Path(answer.json()["path"]).read_bytes() == replacement
