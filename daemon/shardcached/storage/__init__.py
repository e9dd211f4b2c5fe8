"""Storage: the cache directory, its index of resident shards and leases, and room in it.

The package's face. `Store` indexes the resident shards and accounts their bytes (layout: the files of an
entry; recovery: what a crash left; pins: who pins what by lease); `Space` makes room (eviction, waiting for
leases, the filesystem's free space); `CacheDirLock` and `CacheDirWatch` hold the directory (one daemon, a
vanished directory recreated); `ChecksumCheck` and the checksum helpers verify copies; `SizingCheck` warns
when the cache is too small for its readers."""

from __future__ import annotations

from shardcached.storage.cachedir import CacheDirWatch
from shardcached.storage.checksums import normalize_checksum, parse_checksum
from shardcached.storage.dirlock import LOCK_NAME, CacheDirLock
from shardcached.storage.layout import PARTIAL_TTL_S, Entry
from shardcached.storage.pins import pid_job
from shardcached.storage.sizing import SizingCheck, required_capacity
from shardcached.storage.space import Space
from shardcached.storage.store import Store
from shardcached.storage.verify import ChecksumCheck

__all__ = [
    "CacheDirLock",
    "CacheDirWatch",
    "ChecksumCheck",
    "Entry",
    "LOCK_NAME",
    "PARTIAL_TTL_S",
    "SizingCheck",
    "Space",
    "Store",
    "normalize_checksum",
    "parse_checksum",
    "pid_job",
    "required_capacity",
]
