"""Room in the cache: what to evict so a download fits, waiting for leases, and eviction bookkeeping.

Space is reserved before a download starts, evicting what the planner chooses, so the capacity holds with
downloads in flight, and so does the cache filesystem's real free space (statvfs): eviction keeps at least
`min_free` bytes free there (`--min-free`), whatever else writes to that filesystem. Shards that opens are
waiting to lease (`awaiting`) are never chosen: their open was recorded on arrival, so no plan protects
them any more.

An open waits for room (up to `--evict-wait-s`) only where waiting can give it: the bytes the cache itself
holds (leased shards, evicted files kept for their leases, downloads in flight) are released by its own
clients. When the cache filesystem lacks more than all of those together, the space is held by files that
are not ours, and the open is refused at once (507 `cache_disk_full`): the client then reads directly.
When the capacity lacks more than the downloads in flight will give back, leases alone hold it (a reader
ends one only when it closes the shard, a leaking one only at the TTL): the open waits `PINNED_WAIT_S` (1 s)
for readers to close what they read, then is refused (507 `cache_pinned`); the client reads directly for a
few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator

from shardcached.errors import InsufficientCapacity, NoRoom, ShuttingDown
from shardcached.metrics import Metrics
from shardcached.planning import REFILE_CHUNK, Planner, prefetch_victim, refiled
from shardcached.storage.layout import Entry
from shardcached.storage.store import Store

logger = logging.getLogger(__name__)
# How long an open waits for leases alone to give back room before 507 cache_pinned (see `make_room`).
PINNED_WAIT_S = 1.0


class Space:
    """Room-making and eviction over one store; runs on the event loop."""

    def __init__(
        self,
        store: Store,
        planner: Planner,
        metrics: Metrics,
        *,
        evict_wait_s: float,
        clock: Callable[[], float],
        closing: Callable[[], bool],
        min_free: int = 0,
        refile_piece: int = REFILE_CHUNK,
    ) -> None:
        self.store = store
        self.refile_piece = refile_piece  # dropped plans' shards refiled per loop step before a decision
        self.min_free = min_free
        self.planner = planner
        self.metrics = metrics
        self.evict_wait_s = evict_wait_s
        self._clock = clock
        self._closing = closing
        self._awaited: dict[str, int] = {}  # url -> opens waiting for its fetch, not yet leased
        self.evictions = 0
        self.room_waits = 0  # opens that waited for room, for `GET /v1/stats`
        self._changed = asyncio.Event()
        store.watch(planner)  # the planner orders the resident shards for eviction (nextuse.py)

    def _usable(self, url: str) -> bool:
        """Whether a resident shard may be evicted now: no lease holds it and no open awaits it."""
        return self.store.is_evictable(url) and url not in self._awaited

    def _victim(self, url: str, *, demand: bool, warm: bool) -> str | None:
        """The planner's victim for a fetch of `url`; None when a prefetch must wait or nothing is usable."""
        planner, usable = self.planner, self._usable
        if demand:
            return planner.choose_resident_victim(usable)
        return prefetch_victim(
            lambda incoming: planner.choose_resident_victim(usable, incoming),
            planner.next_use_at,
            url,
            warm=warm,
        )

    @contextlib.contextmanager
    def awaiting(self, url: str) -> Iterator[None]:
        """While an open waits for `url`'s fetch: never pick `url` as a victim.

        The open was recorded on arrival, so no plan protects the shard any more: until it is leased,
        `make_room` must not evict it (another fetch may finish in between).
        """
        self._awaited[url] = self._awaited.get(url, 0) + 1
        try:
            yield
        finally:
            if (left := self._awaited.pop(url) - 1) > 0:
                self._awaited[url] = left

    def changed(self) -> None:
        """Space or leases changed: wake the opens waiting for room."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def make_room(self, size: int, url: str, *, demand: bool, warm: bool = False) -> None:
        """Evict until `size` more bytes fit, then reserve them.

        A demand fetch evicts what the planner chooses; a prefetch only what is needed later than `url`;
        warming (`POST /v1/prefetch`) a prefetch's victims or else shards in no plan, never a planned one.

        Raises:
            InsufficientCapacity: the shard exceeds the capacity, or downloads in flight hold the room
                past `evict_wait_s` (`insufficient_capacity`); leases alone hold the room, at once
                (`cache_pinned`); the cache filesystem stays short after `evict_wait_s`, or at
                once when other files hold more of it than the cache could ever give back
                (`cache_disk_full`).
            NoRoom: a prefetch would have to evict something needed sooner.
        """
        store = self.store
        if size > store.capacity:
            raise InsufficientCapacity(
                f"{url} has {size} bytes, more than the cache capacity of {store.capacity} bytes; "
                f"raise shardcached --capacity or read it directly"
            )
        started = self._clock()
        deadline = started + self.evict_wait_s
        # Room held by leases alone is waited for only briefly: a reader closes a shard within moments of
        # reading it (a job with many readers on a tight cache), but a leak or a holder that cannot be seen
        # holds it for the lease TTL, and `evict_wait_s` per open would stall the other job for nothing.
        pinned_deadline = started + min(self.evict_wait_s, PINNED_WAIT_S)
        waited = False
        while not store.fits(size) or self.disk_short(size):
            # The planner walks its ordered resident shards, asking `_usable` of those it meets: no list of
            # every resident shard per decision (O(log R), not O(R) per eviction). Dropped plans' shards
            # are refiled first, in pieces (stale slots' among them: the decision would drop them itself);
            # the room may have changed meanwhile, so look again.
            self.planner.expire_due()
            if self.planner.refile_pending:
                await refiled(self.planner, self.refile_piece)
                continue
            victim = self._victim(url, demand=demand, warm=warm)
            if victim is None and not demand and self.planner.has_resident(self._usable):
                raise NoRoom(url)  # a prefetch must wait: everything usable is needed sooner
            if victim is not None:
                reason = "prefetch" if not demand else "capacity" if not store.fits(size) else "disk_full"
                self.evict(victim, reason)
                continue
            if store.drop_oldest_partial():
                continue  # partial downloads nobody resumed go before anyone waits
            if not demand:
                raise NoRoom(url)
            if self._closing():
                raise ShuttingDown("the daemon is shutting down; retry shortly")
            short = self.disk_short(size)
            if short > self.reclaimable():
                # Even evicting every shard once its leases end and downloads finish would leave the disk
                # short: files that are not ours hold the space, and no release of ours can free it, so
                # waiting `evict_wait_s` would only stall the open (10 s per shard by default).
                raise InsufficientCapacity(
                    f"no room for {url} ({size} bytes): the cache filesystem of {store.cache_dir} lacks "
                    f"{short} bytes (keeping {self.min_free} bytes free, --min-free), more than the "
                    f"{self.reclaimable()} bytes the cache itself holds there: other files fill it; free "
                    f"space there or move shardcached --cache-dir to a filesystem with room (clients read "
                    f"shards directly meanwhile)",
                    code="cache_disk_full",
                )
            pinned_short = store.used + size - store.capacity - store.reserved_bytes
            if pinned_short > 0 and self._clock() >= pinned_deadline:
                # Downloads in flight cannot give the room back even once done: leases alone hold it, and
                # they did not end within PINNED_WAIT_S: a leak, or readers that keep shards open.
                raise InsufficientCapacity(
                    f"no room for {url} ({size} bytes): {store.used} of {store.capacity} bytes are pinned by "
                    f"open shards (see `shardcache stats` for pins per job); the shard is read directly "
                    f"meanwhile. Close shards once read, or raise shardcached --capacity",
                    code="cache_pinned",
                )
            remaining = deadline - self._clock()
            if remaining <= 0 and short:
                raise InsufficientCapacity(
                    f"no room for {url} ({size} bytes): the cache filesystem of {store.cache_dir} lacks "
                    f"{short} bytes (keeping {self.min_free} bytes free, --min-free) and every shard on it "
                    f"is leased or being downloaded; free space there, or set shardcached --capacity below "
                    f"what the disk holds",
                    code="cache_disk_full",
                )
            if remaining <= 0:
                raise InsufficientCapacity(
                    f"no room for {url} ({size} bytes): {store.used} of {store.capacity} bytes are leased or "
                    f"being downloaded and stayed so for --evict-wait-s; retry later or raise shardcached "
                    f"--capacity"
                )
            if not waited:
                waited = True  # counted once per open, however often it wakes
                self.room_waits += 1
                self.metrics.room_waits.labels("disk_full" if short else "capacity").inc()
            changed = self._changed
            if pinned_short > 0:
                remaining = min(remaining, pinned_deadline - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(remaining, 0.0))
        store.reserve(size)

    def reclaimable(self) -> int:
        """Bytes of the cache filesystem that the cache's own clients will give back: resident shards
        (leased or awaited ones once released), evicted files kept for their leases, and the reservations
        of downloads in flight (their shards become evictable once done). Partial files are dropped before
        anyone waits, so they are not counted."""
        store = self.store
        return store.resident_bytes + store.doomed_bytes + store.reserved_bytes

    def disk_free(self) -> int:
        """Free bytes of the cache filesystem for unprivileged writers (statvfs), -1 when unknown."""
        try:
            fs = os.statvfs(self.store.cache_dir)
        except OSError as exc:
            logger.debug("statvfs of %s failed: %s", self.store.cache_dir, exc)
            return -1
        return fs.f_bavail * fs.f_frsize

    def disk_short(self, size: int) -> int:
        """Bytes the cache filesystem lacks to take `size` more bytes besides the downloads in flight and
        still keep `min_free` bytes free.

        `--capacity` may exceed what the disk really has free (other files, a shared or small filesystem),
        so making room also evicts until the free space holds the shard; ENOSPC mid-download is then the
        exception (a 507), not how a full disk is found. In-flight downloads count with their whole
        reservation, although part of it is already written: erring towards one eviction too many only
        when the disk is that full.
        """
        free = self.disk_free()
        if free < 0:  # not knowing is not a reason to refuse: the download will tell
            return 0
        return max(0, size + self.store.reserved_bytes + self.min_free - free)

    def evict(self, url: str, reason: str) -> Entry:
        """Drop `url` from the cache (files live on until its leases end; a broken file, reason `invalid`,
        goes at once) and count why."""
        entry = self.store.remove(url, broken=reason == "invalid")
        self.planner.forget(url)
        self.evictions += 1
        self.metrics.evictions.labels(reason).inc()
        if entry.prefetched and not entry.used:
            self.metrics.prefetched.labels("evicted_unused").inc()
        logger.info("evicted %s (%d bytes, %s)", url, entry.size, reason)
        return entry

    def trim(self) -> int:
        """Evict until the store fits its capacity and the disk keeps `min_free` free (at start: a restart
        with a smaller capacity, or a disk that filled meanwhile); returns how many shards went."""
        evicted = 0
        while (over := self.store.used > self.store.capacity) or self.disk_short(0):
            victim = self.planner.choose_resident_victim(self._usable)
            if victim is None:
                break
            self.evict(victim, "capacity" if over else "disk_full")
            evicted += 1
        return evicted
