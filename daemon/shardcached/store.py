"""Shard files under the cache directory: index, atomic publish, recovery, capacity accounting and leases.

Layout: `<key><suffix>` holds a shard's bytes and `<key>.meta.json` its URL, version, size and checksum.
Downloads write `.tmp-*` files in the same directory; `finalize` fsyncs and renames them, meta first, so
a shard is visible only once complete. At start `recover` removes temp files and any data/meta file without
its partner (or with the wrong size) and rebuilds the index from what is really on disk.

A download cut by a graceful shutdown leaves `.part-<key>`: the bytes received so far, fsynced. The key
holds the remote version, so the next fetch of the same version resumes it (fetcher.py) and a changed
object never does. Partial files are never indexed nor served; they are kept `PARTIAL_TTL_S` and dropped
first when room is short.

Capacity counts resident shards, reservations of in-flight downloads, evicted shards whose files are
kept until their leases end, and partial files. All methods except `finalize` run on the event loop
thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shardcached.errors import NotFound

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
PART_PREFIX = ".part-"
META_SUFFIX = ".meta.json"
PARTIAL_TTL_S = 3600.0  # a partial download nobody resumed within this long is removed


@dataclass(eq=False)
class Entry:
    """One resident shard."""

    key: str
    url: str
    version: str
    size: int
    path: Path
    checksum: str | None = None
    last_use: float = field(default_factory=time.time)
    validated_at: float = 0.0
    leases: int = 0
    prefetched: bool = False
    used: bool = False
    doomed: bool = False

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.key + META_SUFFIX)


@dataclass(eq=False)
class Lease:
    id: str
    entry: Entry
    expires: float


class Store:
    """The index of resident shards and the byte accounting against `capacity`."""

    def __init__(
        self,
        cache_dir: Path,
        capacity: int,
        lease_ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache_dir = cache_dir
        self.capacity = capacity
        self.lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._by_url: dict[str, Entry] = {}
        self._doomed: dict[str, Entry] = {}
        self._leases: dict[str, Lease] = {}
        self.resident_bytes = 0
        self.doomed_bytes = 0
        self.reserved_bytes = 0
        self._partials: dict[str, tuple[int, float]] = {}  # key -> (bytes, mtime) of `.part-<key>`
        self.partial_bytes = 0

    @property
    def by_url(self) -> Mapping[str, Entry]:
        """Resident shards by canonical URL (read-only: `add`, `remove` and `revive` change it)."""
        return self._by_url

    # -- accounting -------------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Bytes counted against the capacity: resident, doomed-but-leased, reserved and partial."""
        return self.resident_bytes + self.doomed_bytes + self.reserved_bytes + self.partial_bytes

    def fits(self, size: int) -> bool:
        return self.used + size <= self.capacity

    def reserve(self, size: int) -> None:
        """Count `size` bytes of a download that is about to start (call `fits` first)."""
        self.reserved_bytes += size

    def unreserve(self, size: int) -> None:
        self.reserved_bytes -= size

    # -- recovery and publishing ------------------------------------------------------------------------
    def recover(self) -> int:
        """Remove leftovers of a crash and rebuild the index from disk; returns the shards found.

        Only regular files count: a symlink (or anything else) planted under a shard's name is removed,
        never indexed, so the daemon cannot be made to serve a file it did not write. A crash while a stale
        version was kept for a lease can leave two versions of one URL; the newest is kept.
        """
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        names = set(os.listdir(self.cache_dir))
        data_names: set[str] = set()
        newest: dict[str, tuple[int, Entry]] = {}
        for name in sorted(names):
            path = self.cache_dir / name
            if name.startswith(TEMP_PREFIX):
                logger.info("removing temp file left by an interrupted download: %s", path)
                _remove(path)
            elif name.startswith(PART_PREFIX):
                self._recover_partial(path)
            elif name.endswith(META_SUFFIX):
                loaded = self._load_meta(path, names)
                if loaded is None:
                    _remove(path)
                    continue
                entry, written_ns = loaded
                data_names.add(entry.path.name)
                kept = newest.get(entry.url)
                if kept is not None and kept[0] >= written_ns:
                    older: Entry | None = entry
                else:
                    newest[entry.url] = (written_ns, entry)
                    older = kept[1] if kept is not None else None
                if older is not None:
                    logger.info("removing an older version of %s: %s", older.url, older.path.name)
                    self._unlink(older)
        for _, entry in newest.values():
            self._insert(entry)
        for name in names - data_names:
            if name.startswith((TEMP_PREFIX, PART_PREFIX)) or name.endswith(META_SUFFIX):
                continue
            if len(name) >= 64:
                logger.info("removing shard file without metadata: %s", name)
                _remove(self.cache_dir / name)
        logger.info(
            "recovered %d shards (%d bytes) from %s", len(self.by_url), self.resident_bytes, self.cache_dir
        )
        return len(self.by_url)

    def _recover_partial(self, path: Path) -> None:
        try:
            info = path.lstat()
        except OSError:
            return
        if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime > PARTIAL_TTL_S:
            logger.info("removing partial download %s (too old, or not a regular file)", path)
            _remove(path)
            return
        key = path.name.removeprefix(PART_PREFIX)
        self._partials[key] = (info.st_size, info.st_mtime)
        self.partial_bytes += info.st_size
        logger.info("keeping partial download %s (%d bytes) to resume", path.name, info.st_size)

    # -- partial downloads ------------------------------------------------------------------------------
    def partial_path(self, key: str) -> Path:
        """Where a cut download of the shard version `key` keeps its bytes."""
        return self.cache_dir / f"{PART_PREFIX}{key}"

    def claim_partial(self, key: str) -> Path | None:
        """The partial file of `key` for a download to resume (no longer counted here), or None."""
        found = self._partials.pop(key, None)
        if found is None:
            return None
        self.partial_bytes -= found[0]
        return self.partial_path(key)

    def keep_partial(self, key: str) -> None:
        """Count `key`'s partial file again if it is on disk (a claimed one that was not resumed)."""
        try:
            info = self.partial_path(key).lstat()
        except OSError:
            return
        if key not in self._partials and stat.S_ISREG(info.st_mode):
            self._partials[key] = (info.st_size, info.st_mtime)
            self.partial_bytes += info.st_size

    def drop_oldest_partial(self) -> bool:
        """Remove the oldest partial file to make room; False when there is none."""
        if not self._partials:
            return False
        key = min(self._partials, key=lambda k: self._partials[k][1])
        size, _ = self._partials.pop(key)
        self.partial_bytes -= size
        _remove(self.partial_path(key))
        logger.info("dropped the partial download of key %s (%d bytes) to make room", key, size)
        return True

    def expire_partials(self, now: float | None = None) -> int:
        """Remove partial files older than `PARTIAL_TTL_S` (wall-clock `now`); returns how many."""
        now = time.time() if now is None else now
        old = [key for key, (_, mtime) in self._partials.items() if now - mtime > PARTIAL_TTL_S]
        for key in old:
            size, _ = self._partials.pop(key)
            self.partial_bytes -= size
            _remove(self.partial_path(key))
        return len(old)

    def _load_meta(self, meta_path: Path, names: set[str]) -> tuple[Entry, int] | None:
        """The entry a meta file describes and the meta's mtime in ns, or None if it is not servable."""
        try:
            key = meta_path.name.removesuffix(META_SUFFIX)
            meta_stat = meta_path.lstat()
            if not stat.S_ISREG(meta_stat.st_mode):
                logger.warning("removing %s: not a regular file (planted in the cache dir?)", meta_path)
                return None
            meta = json.loads(_read_nofollow(meta_path))
            data = self.cache_dir / str(meta["file"])
            if data.name not in names or not data.name.startswith(key):
                return None
            data_stat = data.lstat()  # never through a link: a planted symlink must not be served
            if not stat.S_ISREG(data_stat.st_mode):
                logger.warning("removing %s: not a regular file (planted in the cache dir?)", data)
                _remove(data)
                return None
            if data_stat.st_size != int(meta["size"]):
                logger.warning(
                    "removing %s: %d bytes on disk, %s expected", data, data_stat.st_size, meta["size"]
                )
                _remove(data)
                return None
            entry = Entry(
                key=key,
                url=str(meta["url"]),
                version=str(meta["version"]),
                size=int(meta["size"]),
                path=data,
                checksum=meta.get("checksum"),
                last_use=meta_stat.st_mtime,
            )
            return entry, meta_stat.st_mtime_ns
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("removing unreadable shard metadata %s: %s", meta_path, exc)
            return None

    def regular_stat(self, entry: Entry) -> os.stat_result | None:
        """`lstat` of the entry's file while it is a regular file; None once removed or replaced (a link)."""
        try:
            file_stat = entry.path.lstat()
        except FileNotFoundError:
            return None
        return file_stat if stat.S_ISREG(file_stat.st_mode) else None

    def temp_path(self, key: str) -> Path:
        return self.cache_dir / f"{TEMP_PREFIX}{key[:16]}-{secrets.token_hex(4)}"

    def finalize(self, tmp: Path, entry: Entry) -> None:
        """Publish a fully written, fsynced temp file as `entry` (blocking; called from a worker thread)."""
        self.write_meta(entry)
        os.replace(tmp, entry.path)
        self._sync_dir()

    def write_meta(self, entry: Entry) -> None:
        """Atomically (re)write the entry's metadata, e.g. once its checksum is verified (blocking)."""
        meta = {
            "url": entry.url,
            "version": entry.version,
            "size": entry.size,
            "checksum": entry.checksum,
            "file": entry.path.name,
        }
        meta_tmp = self.temp_path(entry.key + "m")
        with open(meta_tmp, "w") as out:
            json.dump(meta, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(meta_tmp, entry.meta_path)

    def _sync_dir(self) -> None:
        fd = os.open(self.cache_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def add(self, entry: Entry) -> None:
        """Index a published shard."""
        old = self.by_url.get(entry.url)
        if old is not None and old.key != entry.key:
            self.remove(entry.url)
        if entry.url not in self.by_url:
            self._insert(entry)

    def _insert(self, entry: Entry) -> None:
        self._by_url[entry.url] = entry
        self.resident_bytes += entry.size

    def revive(self, key: str, checksum: str | None = None) -> Entry | None:
        """Put back a shard that was evicted but whose file lives on for its leases.

        With a `checksum`, only a shard verified against that same checksum comes back.
        """
        entry = self._doomed.get(key)
        if entry is not None and checksum is not None and entry.checksum != checksum:
            return None
        entry = self._doomed.pop(key, None)
        if entry is not None:
            self.doomed_bytes -= entry.size
            entry.doomed = False
            self._insert(entry)
        return entry

    # -- eviction ---------------------------------------------------------------------------------------
    def evictable(self) -> list[str]:
        """URLs of resident shards no lease holds."""
        return [url for url, entry in self._by_url.items() if entry.leases == 0]

    def remove(self, url: str) -> Entry:
        """Drop a shard from the index; its files go now, or when its last lease ends.

        Raises:
            NotFound: the shard is not resident.
        """
        entry = self._by_url.pop(url, None)
        if entry is None:
            raise NotFound(f"{url} is not in the cache", code="not_resident")
        self.resident_bytes -= entry.size
        if entry.leases > 0:
            entry.doomed = True
            self._doomed[entry.key] = entry
            self.doomed_bytes += entry.size
        else:
            self._unlink(entry)
        return entry

    def _unlink(self, entry: Entry) -> None:
        # Meta first: a crash between the two leaves a data file without meta, which recovery removes.
        entry.meta_path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()

    # -- leases -----------------------------------------------------------------------------------------
    def lease(self, entry: Entry) -> str:
        lease_id = secrets.token_hex(12)
        self._leases[lease_id] = Lease(lease_id, entry, self._clock() + self.lease_ttl_s)
        entry.leases += 1
        return lease_id

    def release(self, lease_id: str) -> bool:
        """End a lease; False if it is unknown or expired."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        if lease.expires < self._clock():
            self._end(lease)
            return False
        self._end(lease)
        return True

    def _end(self, lease: Lease) -> None:
        entry = lease.entry
        entry.leases -= 1
        if entry.leases == 0 and entry.doomed:
            self._doomed.pop(entry.key, None)
            self.doomed_bytes -= entry.size
            self._unlink(entry)

    def expire_leases(self) -> int:
        """End every lease past its TTL; returns how many."""
        now = self._clock()
        expired = [lease for lease in self._leases.values() if lease.expires < now]
        for lease in expired:
            del self._leases[lease.id]
            self._end(lease)
        return len(expired)

    @property
    def lease_count(self) -> int:
        return len(self._leases)


def _remove(path: Path) -> None:
    """Unlink a file or a link (never what it points to); a directory planted there is left, logged."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        logger.warning("leaving directory %s in the cache dir: remove it by hand", path)
    except OSError as exc:
        logger.warning("could not remove %s: %s", path, exc)


def _read_nofollow(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as meta:
        return meta.read()
