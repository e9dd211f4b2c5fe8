"""A cache on a small filesystem whose free space is less than `--capacity` says: the daemon must respect
the real free space, evict to make room, refuse cleanly with 507 when nothing can go, and never crash or
publish a partial shard."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.daemon_api import api, metric
from harness.shards import ShardSet
from tests.hardening.cache_checks import assert_cache_intact

ENOSPC_BUG = (
    "the daemon counts only --capacity, never the filesystem's free space: since a971a67 a download that "
    "hits ENOSPC answers 507 cache_disk_full (no longer a retried 502), but nothing is evicted to make room, "
    "so a cache whose --capacity exceeds the disk refuses shards while evictable ones fill it. Fix: in "
    "ShardService._make_room also require size <= statvfs(cache_dir).f_bavail * f_frsize, evicting (the "
    "planner's victims) until it holds, and only then answer 507"
)
# `small_fs` (a 3 MiB tmpfs mounted per test) is in tests/hardening/conftest.py.


def one_mib_shards(make_bucket: Callable[..., ShardSet]) -> ShardSet:
    return make_bucket(count=6, samples=16, payload_bytes=60 * 1024)  # ~1 MiB each: 3 fit on disk at most


def test_a_share_capacity_is_resolved_against_the_small_filesystem(small_fs, daemon_factory, make_bucket):
    shards = make_bucket(count=1, samples=2)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity="50%", cache_dir=small_fs / "cache")
    with api(daemon) as http:
        assert http.get("/v1/stats").json()["capacity"] == 3 * 1024 * 1024 // 2


@pytest.mark.timeout(90)
def test_opens_beyond_the_real_free_space_evict_instead_of_failing(small_fs, daemon_factory, make_bucket):
    shards = one_mib_shards(make_bucket)
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity="64MiB",
        cache_dir=small_fs / "cache",
        extra_args=["--retries", "1", "--retry-backoff-s", "0.01"],
    )
    with api(daemon) as http:
        for url in shards.s3_urls:
            answer = http.post("/v1/shards/open", json={"url": url})
            assert answer.status_code == 200, answer.text
            http.post("/v1/shards/release", json={"lease": answer.json()["lease"]})
        assert http.get("/v1/stats").json()["evictions"] >= 3


@pytest.mark.timeout(90)
def test_a_full_filesystem_with_every_shard_leased_answers_507(small_fs, daemon_factory, make_bucket):
    shards = one_mib_shards(make_bucket)
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity="64MiB",
        cache_dir=small_fs / "cache",
        extra_args=["--retries", "1", "--retry-backoff-s", "0.01", "--evict-wait-s", "0.5"],
    )
    with api(daemon) as http:
        statuses = [http.post("/v1/shards/open", json={"url": url}).status_code for url in shards.s3_urls]
    assert 507 in statuses and set(statuses) <= {200, 507}, statuses


@pytest.mark.timeout(90)
def test_a_full_filesystem_never_crashes_the_daemon_nor_leaves_a_partial_shard(
    small_fs, daemon_factory, make_bucket
):
    shards = one_mib_shards(make_bucket)
    cache = small_fs / "cache"
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity="64MiB",
        cache_dir=cache,
        extra_args=["--retries", "1", "--retry-backoff-s", "0.01", "--evict-wait-s", "0.5"],
    )
    with api(daemon) as http:
        answers = [http.post("/v1/shards/open", json={"url": url}) for url in shards.s3_urls]
        assert http.get("/v1/health").status_code == 200
    seen = [(a.status_code, a.text[:300]) for a in answers]
    for answer in answers:
        if answer.status_code >= 400:
            assert answer.headers.get("content-type") == "application/json", seen
            assert answer.json()["error"] != "internal" and answer.json()["detail"], seen
    originals = dict(zip(shards.s3_urls, map(Path, shards.local_paths), strict=True))
    assert assert_cache_intact(cache, originals) >= 1
    assert daemon.process.poll() is None


@pytest.mark.timeout(90)
def test_a_co_located_write_within_the_free_space_floor_succeeds_after_the_cache_filled_the_disk(
    small_fs, daemon_factory, make_bucket
):
    shards = one_mib_shards(make_bucket)
    cache = small_fs / "cache"
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity="100%",
        cache_dir=cache,
        extra_args=["--min-free", "1600KiB", "--retries", "1", "--retry-backoff-s", "0.01"],
    )
    with api(daemon) as http:
        for url in shards.s3_urls:
            answer = http.post("/v1/shards/open", json={"url": url})
            assert answer.status_code == 200, answer.text
            http.post("/v1/shards/release", json={"lease": answer.json()["lease"]})
    assert metric(daemon, "shardcache_evictions_total", 'reason="disk_full"') >= 1
    # Another program on the same 3 MiB disk: with the default floor (5%) two ~1 MiB shards would stay and
    # leave ~1.1 MiB free; the 1600 KiB floor keeps one, so this write fits.
    (small_fs / "neighbour.bin").write_bytes(b"n" * 1500 * 1024)
