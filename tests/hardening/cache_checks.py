"""Checks of a cache directory in the hardening tests: what it publishes, and that each shard is intact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published_shards(cache_dir: Path) -> dict[str, Path]:
    """URL -> data file of every shard the cache directory publishes (a `.meta.json` beside its data)."""
    found = {}
    for meta in cache_dir.glob("*.meta.json"):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue  # removed while we looked
        found[str(info["url"])] = cache_dir / str(info["file"])
    return found


def assert_cache_intact(cache_dir: Path, originals: dict[str, Path]) -> int:
    """Every published shard is byte-identical to its original; no temp file is left. Returns the count."""
    shards = published_shards(cache_dir)
    for url, data in shards.items():
        assert url in originals, f"{url} published but never requested"
        assert data.stat().st_size == originals[url].stat().st_size, f"{data} ({url}) has the wrong size"
        assert sha256(data) == sha256(originals[url]), f"{data} ({url}) differs from the remote object"
    leftovers = [p.name for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == [], f"temp files left in the cache: {leftovers}"
    return len(shards)
