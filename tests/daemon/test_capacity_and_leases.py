"""Capacity is never exceeded; leases keep handed-out files alive; what cannot fit gets 507."""

from __future__ import annotations

from pathlib import Path

from harness.daemon_api import api, metric
from harness.polling import wait_for


def _cache_bytes(cache_dir: Path) -> int:
    return sum(p.stat().st_size for p in cache_dir.iterdir() if not p.name.endswith(".meta.json"))


def test_a_stream_of_opens_over_more_data_than_the_capacity_never_exceeds_it(make_bucket, daemon_factory):
    shards = make_bucket(count=8, samples=16, payload_bytes=8 * 1024)
    size = shards.size_of(shards.names[0])
    capacity = 3 * size + size // 2
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity=f"{capacity}B")
    with api(daemon) as http:
        for url in shards.s3_urls * 2:
            answer = http.post("/v1/shards/open", json={"url": url}).json()
            http.post("/v1/shards/release", json={"lease": answer["lease"]}).raise_for_status()
            stats = http.get("/v1/stats").json()
            assert stats["used"] <= capacity
            assert _cache_bytes(daemon.cache_dir) <= capacity
        assert stats["resident_shards"] == 3
        assert stats["evictions"] == 13
    assert metric(daemon, "shardcache_resident_bytes") <= capacity
    assert metric(daemon, "shardcache_evictions_total", 'reason="capacity"') == 13


def test_a_shard_larger_than_the_capacity_is_507(make_bucket, daemon_factory):
    shards = make_bucket(count=1, samples=16, payload_bytes=8 * 1024)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity="10KiB")
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]})
    assert answer.status_code == 507
    assert "--capacity" in answer.json()["detail"]


def test_an_open_that_only_leased_shards_could_make_room_for_is_507(make_bucket, daemon_factory):
    shards = make_bucket(count=2, samples=16, payload_bytes=8 * 1024)
    size = shards.size_of(shards.names[0])
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"], capacity=f"{size + size // 2}B", extra_args=["--evict-wait-s", "0.3"]
    )
    with api(daemon) as http:
        held = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
        refused = http.post("/v1/shards/open", json={"url": shards.s3_urls[1]})
        assert Path(held["path"]).exists()
    assert refused.status_code == 507


def test_releasing_a_lease_lets_the_shard_be_evicted(make_bucket, daemon_factory):
    shards = make_bucket(count=2, samples=16, payload_bytes=8 * 1024)
    size = shards.size_of(shards.names[0])
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity=f"{size + size // 2}B")
    with api(daemon) as http:
        first = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
        assert http.post("/v1/shards/release", json={"lease": first["lease"]}).status_code == 204
        second = http.post("/v1/shards/open", json={"url": shards.s3_urls[1]})
    assert second.status_code == 200
    assert not Path(first["path"]).exists()


def test_an_unknown_or_already_released_lease_is_404(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        lease = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()["lease"]
        assert http.post("/v1/shards/release", json={"lease": lease}).status_code == 204
        again = http.post("/v1/shards/release", json={"lease": lease})
        unknown = http.post("/v1/shards/release", json={"lease": "no-such-lease"})
    assert (again.status_code, unknown.status_code) == (404, 404)
    assert unknown.json()["error"] == "unknown_lease"


def test_evicting_a_leased_shard_keeps_its_file_until_the_lease_ends(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    size = shards.size_of(shards.names[0])
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        held = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
        assert http.delete("/v1/shards", params={"url": shards.s3_urls[0]}).status_code == 204
        during = http.get("/v1/stats").json()
        assert Path(held["path"]).read_bytes() == Path(shards.local_paths[0]).read_bytes()
        http.post("/v1/shards/release", json={"lease": held["lease"]}).raise_for_status()
        after = http.get("/v1/stats").json()
    assert (during["resident_shards"], during["used"]) == (0, size)
    assert after["used"] == 0
    assert not Path(held["path"]).exists()


def test_evicting_a_shard_that_is_not_cached_is_404(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        answer = http.delete("/v1/shards", params={"url": shards.s3_urls[0]})
    assert answer.status_code == 404


def test_an_unreleased_lease_expires_after_its_ttl(make_bucket, daemon_factory):
    shards = make_bucket(count=2, samples=16, payload_bytes=8 * 1024)
    size = shards.size_of(shards.names[0])
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity=f"{size + size // 2}B",
        # The TTL outlasts the open's wait for leased room (space.PINNED_WAIT_S, 1 s): with a shorter
        # one the lease could expire during that wait and the refusal below would not happen.
        extra_args=["--lease-ttl-s", "3", "--evict-wait-s", "20"],
    )
    with api(daemon) as http:
        http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).raise_for_status()
        # While the lease pins the room, the second open is refused (after the short wait, not the TTL)...
        refused = http.post("/v1/shards/open", json={"url": shards.s3_urls[1]})
        assert (refused.status_code, refused.json()["error"]) == (507, "cache_pinned")
        # ...and once the lease expired (the holder is alive: only the TTL ends it), it evicts the first.
        wait_for(lambda: http.get("/v1/stats").json()["leases"] == 0, "the lease to expire", 10)
        second = http.post("/v1/shards/open", json={"url": shards.s3_urls[1]})
        listed = http.get("/v1/shards").json()["shards"]
    assert second.status_code == 200
    assert [s["url"] for s in listed] == [shards.s3_urls[1]]
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="ttl"') == 1
