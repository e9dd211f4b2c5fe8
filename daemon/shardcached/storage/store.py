"""The index of resident shards: atomic publish, capacity accounting, partial downloads and leases.

The files are laid out as layout.py describes; `finalize` fsyncs and renames a download's temp file, meta
first, so a shard is visible only once complete. At start `recover` rebuilds the index from what is really
on disk (recovery.py).

A download cut by a graceful shutdown leaves `.part-<key>`: the bytes received so far, fsynced. The key
holds the remote version, so the next fetch of the same version resumes it (fetcher.py) and a changed
object never does. Partial files are never indexed nor served; they are kept `PARTIAL_TTL_S` and dropped
first when room is short.

Capacity counts resident shards, reservations of in-flight downloads, evicted shards whose files are
kept until their leases end, and partial files. All methods except `finalize` run on the event loop
thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from shardcached.errors import NotFound
from shardcached.storage.layout import PART_PREFIX, PARTIAL_TTL_S, TEMP_PREFIX, Entry, remove_file
from shardcached.storage.pins import UNKNOWN_PEER_JOB, Lease, PinLedger
from shardcached.storage.recovery import recover_cache_dir

logger = logging.getLogger(__name__)


class Residency(Protocol):
    """Who keeps its own order of the resident shards (the planner, for eviction): told of every change."""

    def resident(self, url: str) -> None: ...

    def gone(self, url: str) -> None: ...


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
        self.pins = PinLedger()
        self.resident_bytes = 0
        self.doomed_bytes = 0
        self.reserved_bytes = 0
        self._partials: dict[str, tuple[int, float]] = {}  # key -> (bytes, mtime) of `.part-<key>`
        self.partial_bytes = 0
        self._watcher: Residency | None = None

    def watch(self, watcher: Residency) -> None:
        """Tell `watcher` of every shard that becomes resident or leaves, starting with those resident now
        (in the store's order, which eviction uses to break ties)."""
        self._watcher = watcher
        for url in self._by_url:
            watcher.resident(url)

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

    # -- recovery ---------------------------------------------------------------------------------------
    def recover(self) -> int:
        """Remove leftovers of a crash and rebuild the index from disk; returns the shards found.

        See recovery.py for what is kept: only regular files, whole and with their meta, newest version.
        """
        found = recover_cache_dir(self.cache_dir)
        for entry in found.entries:
            self._insert(entry)
        for key, (size, mtime) in found.partials.items():
            self._partials[key] = (size, mtime)
            self.partial_bytes += size
        logger.info(
            "recovered %d shards (%d bytes) from %s", len(self.by_url), self.resident_bytes, self.cache_dir
        )
        return len(self.by_url)

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
        remove_file(self.partial_path(key))
        logger.info("dropped the partial download of key %s (%d bytes) to make room", key, size)
        return True

    def expire_partials(self, now: float | None = None) -> int:
        """Remove partial files older than `PARTIAL_TTL_S` (wall-clock `now`); returns how many."""
        now = time.time() if now is None else now
        old = [key for key, (_, mtime) in self._partials.items() if now - mtime > PARTIAL_TTL_S]
        for key in old:
            size, _ = self._partials.pop(key)
            self.partial_bytes -= size
            remove_file(self.partial_path(key))
        return len(old)

    # -- publishing -------------------------------------------------------------------------------------
    def regular_stat(self, entry: Entry) -> os.stat_result | None:
        """`lstat` of the entry's file while it is a regular file; None once removed or replaced (a link)."""
        try:
            file_stat = entry.path.lstat()
        except FileNotFoundError:
            return None
        return file_stat if stat.S_ISREG(file_stat.st_mode) else None

    def intact(self, entry: Entry) -> bool:
        """Whether the entry's file is still the regular file of `entry.size` bytes the daemon published.

        One `lstat` (about a microsecond): an operator's `rm` or a truncation is noticed at the next open
        instead of being handed out (or streamed) as a broken shard.
        """
        file_stat = self.regular_stat(entry)
        return file_stat is not None and file_stat.st_size == entry.size

    def temp_path(self, key: str) -> Path:
        return self.cache_dir / f"{TEMP_PREFIX}{key[:16]}-{secrets.token_hex(4)}"

    def finalize(self, tmp: Path, entry: Entry) -> None:
        """Publish a fully written, fsynced temp file as `entry` (blocking; called from a worker thread)."""
        self.write_meta(entry)
        os.replace(tmp, entry.path)
        self._sync_dir()

    def write_meta(self, entry: Entry) -> None:
        """Atomically (re)write the entry's metadata, e.g. once its checksum is verified (blocking)."""
        meta_tmp = self.temp_path(entry.key + "m")
        with open(meta_tmp, "w") as out:
            json.dump(entry.meta_record(), out)
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
        if self._watcher is not None:
            self._watcher.resident(entry.url)

    def revive(self, key: str, checksum: str | None = None) -> Entry | None:
        """Put back a shard that was evicted but whose file lives on for its leases.

        With a `checksum`, only a shard verified against that same checksum comes back. A kept file that is
        gone or truncated (someone else touched the cache dir), or that fails the checksum, never comes
        back: it is detached (`detach`) so that the download about to replace it at the same path is not
        unlinked when the old leases end.
        """
        entry = self._doomed.get(key)
        if entry is None:
            return None
        if not self.intact(entry):
            self.detach(entry)
            entry.unlink_files()  # nothing a lease could protect is left there
            return None
        if entry.no_revival or (checksum is not None and entry.checksum != checksum):
            self.detach(entry)
            return None
        del self._doomed[key]
        self.doomed_bytes -= entry.size
        entry.doomed = False
        self._insert(entry)
        return entry

    def detach(self, entry: Entry) -> None:
        """Stop tracking an evicted shard kept for its leases: its lease ends remove nothing any more.

        For a kept file that will be replaced (same key, same path) or that is already gone; a reader that
        has it open keeps reading the old inode.
        """
        if self._doomed.get(entry.key) is entry:
            del self._doomed[entry.key]
            self.doomed_bytes -= entry.size
        entry.doomed = False

    def doomed_entry(self, url: str) -> Entry | None:
        """The evicted-but-leased entry of `url`, if any (linear; for the rare manual eviction only)."""
        return next((entry for entry in self._doomed.values() if entry.url == url), None)

    def forget_all(self) -> list[str]:
        """Drop the whole index without touching the disk (the cache directory vanished); the URLs dropped.

        Leases stay valid as ids (their release answers 204) but end nothing; partial downloads and
        reservations of downloads in flight are their owners' to settle.
        """
        urls = list(self._by_url)
        if self._watcher is not None:
            for url in urls:
                self._watcher.gone(url)
        for entry in [*self._by_url.values(), *self._doomed.values()]:
            entry.doomed = False
        self._by_url.clear()
        self._doomed.clear()
        self._partials.clear()
        self.resident_bytes = self.doomed_bytes = self.partial_bytes = 0
        return urls

    # -- eviction ---------------------------------------------------------------------------------------
    def evictable(self) -> list[str]:
        """URLs of resident shards no lease holds (linear: eviction asks `is_evictable` per shard instead)."""
        return [url for url, entry in self._by_url.items() if entry.leases == 0]

    def is_evictable(self, url: str) -> bool:
        """Whether `url` is resident and no lease holds it."""
        entry = self._by_url.get(url)
        return entry is not None and entry.leases == 0

    def remove(self, url: str, *, broken: bool = False) -> Entry:
        """Drop a shard from the index; its files go now, or when its last lease ends.

        `broken`: the file is no longer what the daemon wrote (gone, truncated, replaced): its names are
        removed now, leases or not, since nothing a lease could protect is left there.

        Raises:
            NotFound: the shard is not resident.
        """
        entry = self._by_url.pop(url, None)
        if entry is None:
            raise NotFound(f"{url} is not in the cache", code="not_resident")
        self.resident_bytes -= entry.size
        if self._watcher is not None:
            self._watcher.gone(url)
        if entry.leases > 0 and not broken:
            entry.doomed = True
            self._doomed[entry.key] = entry
            self.doomed_bytes += entry.size
        else:
            entry.unlink_files()
        return entry

    # -- leases -----------------------------------------------------------------------------------------
    @property
    def lease_count(self) -> int:
        return len(self._leases)

    def lease(self, entry: Entry, job: str = UNKNOWN_PEER_JOB, holder: str | None = None) -> str:
        """Pin `entry` for `job`, held by `holder` (pins.py; None: unknown, only the TTL then ends it)."""
        lease_id = secrets.token_hex(12)
        lease = Lease(lease_id, entry, self._clock() + self.lease_ttl_s, job, holder)
        self._leases[lease_id] = lease
        entry.leases += 1
        self.pins.added(lease)
        return lease_id

    def release_holder(self, holder: str) -> int:
        """End every lease `holder` holds (it is gone); returns how many."""
        ids = self.pins.leases_of(holder)
        for lease_id in ids:
            lease = self._leases.pop(lease_id, None)
            if lease is not None:
                self._end(lease)
        return len(ids)

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
        self.pins.ended(lease)
        entry = lease.entry
        entry.leases -= 1
        if entry.leases == 0 and entry.doomed:
            self.detach(entry)
            entry.unlink_files()

    def expire_leases(self) -> int:
        """End every lease past its TTL; returns how many."""
        now = self._clock()
        expired = [lease for lease in self._leases.values() if lease.expires < now]
        for lease in expired:
            del self._leases[lease.id]
            self._end(lease)
        return len(expired)
