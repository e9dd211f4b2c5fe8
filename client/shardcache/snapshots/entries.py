"""`list_cache_entries` / `clear_cache`: mvp-dataset 0.2.3's cache management API over the `.cache()` store.

mvp-dataset keeps several kinds of artifact under `<root>/<source fingerprint>/<kind>-v<N>/<artifact>/`;
shardcache keeps one kind, the materialised pipeline of `.cache()` / `snapshot()`, under
`<root>/<fingerprint>/` (see `shardcache.snapshots.store`), where one fingerprint covers the source and the
stages. Each complete entry is reported as a `CacheEntryInfo` of kind `"dataset-snapshot"` (mvp's name for
the same artifact) whose `source_fingerprint` and `artifact_fingerprint` are both that fingerprint, so
`clear_cache(source_fingerprint=fp)` removes the entry `shardcache cache ls` shows as `fp`. As in
mvp-dataset, entries still being built are neither listed nor removed.

Example:
    >>> from shardcache import clear_cache, list_cache_entries
    >>> [e.artifact_fingerprint[:12] for e in list_cache_entries()]  # doctest: +SKIP
    ['3f9a0c1d2b4e']
    >>> clear_cache(kind="dataset-snapshot")  # doctest: +SKIP
    1
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shardcache.snapshots.identity import LAYOUT_VERSION
from shardcache.snapshots.store import cache_ls, cache_rm

SNAPSHOT_KIND = "dataset-snapshot"


@dataclass(frozen=True, slots=True)
class CacheEntryInfo:
    """One complete cache entry, in mvp-dataset's shape.

    Attributes:
        source_fingerprint: The entry's fingerprint (shardcache's one fingerprint covers the source too).
        kind: Always `"dataset-snapshot"`.
        format_version: The on-disk layout version of shardcache's cache entries.
        artifact_fingerprint: The entry's fingerprint (its directory name under the root).
        path: The entry's directory.
        size_bytes: Bytes of every file in the entry.
    """

    source_fingerprint: str
    kind: str
    format_version: int
    artifact_fingerprint: str
    path: Path
    size_bytes: int


def list_cache_entries(cache_dir: str | os.PathLike[str] | None = None) -> tuple[CacheEntryInfo, ...]:
    """The complete entries under the cache root, sorted by fingerprint.

    Args:
        cache_dir: The cache root (None: `$SHARDCACHE_CACHE_DIR`, else `$MVP_DATASET_CACHE_DIR`, else
            `.cache`).
    """
    return tuple(
        CacheEntryInfo(
            source_fingerprint=entry.fingerprint,
            kind=SNAPSHOT_KIND,
            format_version=LAYOUT_VERSION,
            artifact_fingerprint=entry.fingerprint,
            path=Path(entry.path),
            size_bytes=entry.size_bytes,
        )
        for entry in cache_ls(cache_dir)
        if entry.complete
    )


def clear_cache(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    source_fingerprint: str | None = None,
    kind: str | None = None,
) -> int:
    """Remove the complete entries that match both filters (None matches all); return how many.

    Args:
        cache_dir: The cache root (as for `list_cache_entries`).
        source_fingerprint: Remove only the entry with this fingerprint.
        kind: Remove only entries of this kind (`"dataset-snapshot"`: all; any other kind: none).

    Raises:
        CacheError: a matching entry is being built again by a running process.
    """
    removed = 0
    for info in list_cache_entries(cache_dir):
        if source_fingerprint is not None and info.source_fingerprint != source_fingerprint:
            continue
        if kind is not None and info.kind != kind:
            continue
        removed += len(cache_rm(info.path.parent, info.artifact_fingerprint))
    return removed
