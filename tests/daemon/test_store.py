"""The store on real files: recovery after a crash, atomic publish, accounting and leases (in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcached.errors import NotFound
from shardcached.keys import cache_key
from shardcached.storage import Entry, Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _publish(store: Store, url: str, data: bytes, version: str = "v1") -> Entry:
    key = cache_key(url, version)
    entry = Entry(key=key, url=url, version=version, size=len(data), path=store.cache_dir / f"{key}.tar")
    tmp = store.temp_path(key)
    tmp.write_bytes(data)
    store.finalize(tmp, entry)
    store.add(entry)
    return entry


def test_published_shards_are_found_again_by_a_new_store(tmp_path: Path):
    store = Store(tmp_path, capacity=1000)
    entry = _publish(store, "s3://b/a.tar", b"x" * 10)
    again = Store(tmp_path, capacity=1000)
    assert again.recover() == 1
    assert again.by_url["s3://b/a.tar"].path == entry.path
    assert again.resident_bytes == 10


def test_recovery_removes_temp_files_and_orphans(tmp_path: Path):
    store = Store(tmp_path, capacity=1000)
    kept = _publish(store, "s3://b/kept.tar", b"k" * 5)
    partial = _publish(store, "s3://b/partial.tar", b"p" * 8)
    partial.path.write_bytes(b"p" * 3)  # truncated behind the index's back
    orphan_meta = _publish(store, "s3://b/meta-only.tar", b"m")
    orphan_meta.path.unlink()
    orphan_data = _publish(store, "s3://b/data-only.tar", b"d")
    orphan_data.meta_path.unlink()
    (tmp_path / ".tmp-0123456789abcdef-dead").write_bytes(b"half a download")
    (tmp_path / "lost+found").mkdir()

    again = Store(tmp_path, capacity=1000)
    assert again.recover() == 1
    assert set(again.by_url) == {"s3://b/kept.tar"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [kept.path.name, kept.meta_path.name, "lost+found"]
    )


def test_recovery_keeps_only_the_newest_version_of_a_url(tmp_path: Path):
    store = Store(tmp_path, capacity=1000)
    stale = _publish(store, "s3://b/a.tar", b"o" * 7, version="v1")
    store.lease(stale)  # its files outlive the new version's publish; then the daemon crashes
    fresh = _publish(store, "s3://b/a.tar", b"n" * 9, version="v2")
    os.utime(stale.meta_path, ns=(1_000_000_000, 1_000_000_000))  # written first, whatever the clock says
    again = Store(tmp_path, capacity=1000)
    assert again.recover() == 1
    assert again.by_url["s3://b/a.tar"].key == fresh.key
    assert again.resident_bytes == 9
    assert not stale.path.exists() and not stale.meta_path.exists()


def test_recovery_removes_a_symlink_planted_under_a_shards_name(tmp_path: Path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4)
    cache = tmp_path / "cache"
    cache.mkdir()
    store = Store(cache, capacity=1000)
    entry = _publish(store, "s3://b/a.tar", b"x" * 4)
    entry.path.unlink()
    entry.path.symlink_to(secret)
    again = Store(cache, capacity=1000)
    assert again.recover() == 0
    assert not entry.path.is_symlink() and secret.read_bytes() == b"s" * 4


def test_capacity_counts_reservations_and_evicted_but_leased_files(tmp_path: Path):
    store = Store(tmp_path, capacity=100)
    entry = _publish(store, "s3://b/a.tar", b"a" * 40)
    store.reserve(30)
    assert store.used == 70
    assert not store.fits(31)
    lease = store.lease(entry)
    store.remove("s3://b/a.tar")
    assert (store.used, entry.path.exists()) == (70, True)
    assert store.release(lease)
    assert (store.used, entry.path.exists()) == (30, False)


def test_leased_shards_are_not_evictable(tmp_path: Path):
    store = Store(tmp_path, capacity=100)
    a = _publish(store, "s3://b/a.tar", b"a")
    _publish(store, "s3://b/b.tar", b"b")
    store.lease(a)
    assert store.evictable() == ["s3://b/b.tar"]


def test_leases_expire_after_their_ttl(tmp_path: Path):
    clock = Clock()
    store = Store(tmp_path, capacity=100, lease_ttl_s=10, clock=clock)
    entry = _publish(store, "s3://b/a.tar", b"a")
    lease = store.lease(entry)
    clock.now += 11
    assert store.expire_leases() == 1
    assert entry.leases == 0
    assert not store.release(lease)


def test_removing_a_shard_that_is_not_resident_is_not_found(tmp_path: Path):
    with pytest.raises(NotFound, match="s3://b/none.tar"):
        Store(tmp_path, capacity=100).remove("s3://b/none.tar")


def test_an_evicted_leased_shard_can_be_revived_without_a_download(tmp_path: Path):
    store = Store(tmp_path, capacity=100)
    entry = _publish(store, "s3://b/a.tar", b"a" * 7)
    store.lease(entry)
    store.remove("s3://b/a.tar")
    assert store.revive(entry.key) is entry
    assert (store.by_url["s3://b/a.tar"], store.used) == (entry, 7)


def test_recovery_keeps_a_fresh_partial_download_unindexed_and_counted_and_drops_an_old_one(tmp_path: Path):
    from shardcached.storage import PARTIAL_TTL_S

    store = Store(tmp_path, capacity=1000)
    fresh, old = store.partial_path(cache_key("s3://b/a.tar", "v1")), store.partial_path("f" * 64)
    fresh.write_bytes(b"x" * 30)
    old.write_bytes(b"y" * 40)
    stale = old.stat().st_mtime - PARTIAL_TTL_S - 60
    os.utime(old, (stale, stale))
    again = Store(tmp_path, capacity=1000)
    assert again.recover() == 0 and dict(again.by_url) == {}
    assert (fresh.exists(), old.exists(), again.used) == (True, False, 30)
    assert again.claim_partial(cache_key("s3://b/a.tar", "v1")) == fresh and again.used == 0
