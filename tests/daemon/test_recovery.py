"""Recovery reads every meta file in the cache directory: what is planted under a meta file's name is
removed, never followed, and never blocks the start (in-process, on real files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardcached.keys import cache_key
from shardcached.storage.layout import META_SUFFIX, Entry
from shardcached.storage.recovery import recover_cache_dir


def _entry(cache: Path, url: str, data: bytes) -> Entry:
    key = cache_key(url, "v1")
    entry = Entry(key=key, url=url, version="v1", size=len(data), path=cache / f"{key}.tar")
    entry.path.write_bytes(data)
    return entry


def test_a_symlink_planted_as_a_meta_file_is_removed_and_its_target_left_alone(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = _entry(cache, "s3://b/a.tar", b"x" * 4)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({**entry.meta_record(), "file": entry.path.name}))
    entry.meta_path.symlink_to(forged)
    assert recover_cache_dir(cache).entries == []
    assert not entry.meta_path.is_symlink() and forged.exists()


def test_a_fifo_planted_as_a_meta_file_is_removed_without_blocking_the_start(tmp_path: Path) -> None:
    # Opening a FIFO for reading waits for a writer: recovery must not, or the daemon never listens.
    entry = _entry(tmp_path, "s3://b/a.tar", b"x" * 4)
    os.mkfifo(entry.meta_path)
    assert recover_cache_dir(tmp_path).entries == []
    assert not entry.meta_path.exists()


def test_every_published_shard_is_recovered_with_its_meta_record(tmp_path: Path) -> None:
    entries = [_entry(tmp_path, f"s3://b/{i}.tar", b"y" * i) for i in range(1, 4)]
    for entry in entries:
        (tmp_path / (entry.key + META_SUFFIX)).write_text(json.dumps(entry.meta_record()))
    found = {e.url: (e.size, e.path) for e in recover_cache_dir(tmp_path).entries}
    assert found == {e.url: (e.size, e.path) for e in entries}
