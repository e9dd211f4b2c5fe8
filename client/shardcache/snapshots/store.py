"""The on-disk layout of cache entries: locks, atomic publication, listing and removal.

```
<cache root>/<fingerprint>/
    entry.json                       what the entry caches (for `shardcache cache ls`)
    locks/part-<D>-<k>.lock          one builder per part (flock; dropped if the builder dies)
    locks/merge.lock
    tmp/<label>.<pid>.<random>/      builds in progress; removed by the next holder of the label's lock
    parts-<D>-order<V>/part-<k>/     part k of D data-parallel slots: data.lance + part.json
    dataset/                         the merged dataset: data.lance + complete.json
```

A directory is published by one `rename` of a temporary directory that already holds its data and its
marker file, so a reader either sees nothing or a complete part (or dataset); a build killed half way leaves
only a temporary directory, which the next builder removes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from shardcache import envvars
from shardcache.durable import FileLock, read_json
from shardcache.errors import CacheError
from shardcache.node import JSONObject
from shardcache.sources.deal.order import ORDER_VERSION

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = envvars.DEFAULT_CACHE_DIR
CACHE_DIR_ENV = envvars.CACHE_DIR_ENV
DATA = "data.lance"
PART_MARKER = "part.json"
DATASET_MARKER = "complete.json"


def resolve_cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache root: `cache_dir`, else `$SHARDCACHE_CACHE_DIR` (else its alias `$MVP_DATASET_CACHE_DIR`),
    else `.cache` in the working directory (`envvars.cache_root`, shared with the Lance indexes)."""
    return envvars.cache_root(cache_dir)


@dataclass(frozen=True)
class EntryPaths:
    """Paths of one cache entry."""

    root: Path

    @property
    def fingerprint(self) -> str:
        return self.root.name

    @property
    def description_file(self) -> Path:
        return self.root / "entry.json"

    @property
    def dataset_dir(self) -> Path:
        return self.root / "dataset"

    @property
    def dataset_uri(self) -> str:
        return str(self.dataset_dir / DATA)

    def dataset_complete(self) -> bool:
        return (self.dataset_dir / DATASET_MARKER).is_file()

    def parts_dir(self, slots: int) -> Path:
        # Part k holds slot k's share of epoch 0's order: parts dealt in another order version (a build
        # left half done by an older shardcache) would overlap and miss rows when merged with these, so
        # they are never picked up. The merged dataset holds every row either way and is reused as it is.
        return self.root / f"parts-{slots}-order{ORDER_VERSION}"

    def part_dir(self, slots: int, index: int) -> Path:
        return self.parts_dir(slots) / f"part-{index:05d}"

    def part_complete(self, slots: int, index: int) -> bool:
        return (self.part_dir(slots, index) / PART_MARKER).is_file()

    def lock(self, label: str) -> FileLock:
        return FileLock(self.root / "locks" / f"{label}.lock")

    def new_tmp(self, label: str) -> Path:
        """A fresh temporary directory for `label`, after removing leftovers of killed builds of it.

        Call only while holding `label`'s lock: then every other temporary of that label is dead.
        """
        tmp_root = self.root / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        for stale in tmp_root.glob(f"{label}.*"):
            logger.info("removing %s left by an interrupted cache build", stale)
            shutil.rmtree(stale, ignore_errors=True)
        path = tmp_root / f"{label}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path


@dataclass(frozen=True)
class CacheEntry:
    """One entry under the cache root, as `shardcache cache ls` shows it."""

    fingerprint: str
    path: str
    complete: bool
    size_bytes: int
    rows: int | None = None
    created: float | None = None
    description: JSONObject = field(default_factory=dict)


def _tree_size(root: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def cache_ls(cache_dir: str | os.PathLike[str] | None = None) -> list[CacheEntry]:
    """The entries under a cache root, sorted by fingerprint.

    Args:
        cache_dir: The cache root (default: `$SHARDCACHE_CACHE_DIR` or `.cache`).
    """
    root = resolve_cache_root(cache_dir)
    if not root.is_dir():
        return []
    entries = []
    # "_locks" and "_tmp" are the Lance indexes' shared folders (sources.lance.store), not entries.
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        paths = EntryPaths(path)
        marker = read_json(paths.dataset_dir / DATASET_MARKER) or {}
        description = read_json(paths.description_file) or {}
        entries.append(
            CacheEntry(
                fingerprint=path.name,
                path=str(path),
                complete=paths.dataset_complete(),
                size_bytes=_tree_size(path),
                rows=marker.get("rows"),
                created=marker.get("created", description.get("created")),
                description=description,
            )
        )
    return entries


def _entry_busy(path: Path) -> bool:
    for lock_file in sorted((path / "locks").glob("*.lock")):
        lock = FileLock(lock_file)
        if not lock.try_acquire():
            return True
        lock.release()
    return False


def cache_rm(cache_dir: str | os.PathLike[str] | None, fingerprint_or_all: str) -> list[str]:
    """Remove one entry (by fingerprint or unique prefix of one) or every entry ("all").

    Args:
        cache_dir: The cache root (None: `$SHARDCACHE_CACHE_DIR` or `.cache`).
        fingerprint_or_all: A fingerprint, a unique prefix of one, or "all".

    Returns:
        The fingerprints removed.

    Raises:
        CacheError: No entry matches, the prefix is ambiguous, or a process is building the entry now.
    """
    root = resolve_cache_root(cache_dir)
    names = [entry.fingerprint for entry in cache_ls(root)]
    if fingerprint_or_all == "all":
        chosen = names
    else:
        chosen = [name for name in names if name.startswith(fingerprint_or_all)]
        if not chosen:
            raise CacheError(
                f"no cache entry {fingerprint_or_all!r} under {root}; `shardcache cache ls` lists them"
            )
        if len(chosen) > 1:
            raise CacheError(f"{fingerprint_or_all!r} matches several cache entries under {root}: {chosen}")
    for name in chosen:
        path = root / name
        if _entry_busy(path):
            raise CacheError(f"cache entry {path} is being built by a running process; stop it first")
        # Rename first so that no reader finds a half-deleted entry under its fingerprint.
        trash = root / f".trash-{name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return chosen
