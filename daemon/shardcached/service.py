"""The cache's behaviour: opens (hit, join an in-flight fetch, or fetch), eviction, prefetch and warming.

Runs on the event loop; blocking I/O (remote reads, writes, fsync, rename) goes to a thread pool. How a
shard is fetched, with single flight per URL, is `downloads.Downloads`'s; making room (eviction,
reservations) `space.Space`'s; whether a resident copy is recent enough to serve, and validating plans'
copies against the remote, `freshness.Freshness`'s; checking a resident copy against an open's checksum
`verify.ChecksumCheck`'s; streamed reads `streams.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shardcache_protocol import OpenGrant
from shardcached.errors import (
    CacheDirMissing,
    InsufficientCapacity,
    NoRoom,
    ShuttingDown,
)
from shardcached.fetching import Downloads, Fetcher, Prefetcher
from shardcached.freshness import Freshness
from shardcached.keys import AllowList, cache_key
from shardcached.metrics import Metrics
from shardcached.owners import Owners
from shardcached.planning import PlanIndexer, Planner
from shardcached.storage import CacheDirLock, CacheDirWatch, ChecksumCheck, Entry, SizingCheck, Space, Store
from shardcached.versions import RemoteVersions

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ShardService:
    """Everything the API does with shards; owns the store, the fetcher and the planner's events."""

    def __init__(
        self,
        store: Store,
        planner: Planner,
        fetcher: Fetcher,
        allow: AllowList,
        metrics: Metrics,
        *,
        max_fetches: int = 4,
        evict_wait_s: float = 10.0,
        revalidate_after_s: float = 3600.0,
        immutable: Sequence[str] = (),
        min_free: int = 0,
        max_job_pinned: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        lock: CacheDirLock | None = None,
    ) -> None:
        self.store = store
        self.planner = planner
        self.fetcher = fetcher
        self.allow = allow
        self.metrics = metrics
        self.max_fetches = max_fetches
        self._clock = clock
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancel = threading.Event()
        self._closing = False
        self._pool = ThreadPoolExecutor(max_workers=max(8, 2 * max_fetches + 4), thread_name_prefix="fetch")
        self.space = Space(
            store,
            planner,
            metrics,
            evict_wait_s=evict_wait_s,
            clock=clock,
            closing=lambda: self._closing,
            min_free=min_free,
        )
        self.owners = Owners(
            store,
            planner,
            metrics,
            max_job_pinned=store.capacity if max_job_pinned is None else max_job_pinned,
            changed=self._notify,
        )
        self.refusals: dict[str, int] = {}  # 507 answers by code, for `GET /v1/stats`
        self.checksums = ChecksumCheck(store, self.space, self._blocking)
        self.cache_dir = CacheDirWatch(store, lock, on_lost=self._lost)
        self.sizing = SizingCheck(store.capacity, planner.prefetch_depth)
        self.prefetcher = Prefetcher(self, planner, clock)
        self.downloads = Downloads(
            store,
            self.space,
            planner,
            fetcher,
            metrics,
            checksums=self.checksums,
            cache_dir=self.cache_dir,
            sizing=self.sizing,
            blocking=self._blocking,
            spawn=self.spawn,
            done=self._notify,
            prefetch_failed=self.prefetcher.note_failure,
            cancel=self._cancel,
            clock=clock,
        )
        self.freshness = Freshness(
            store,
            self.space,
            planner,
            RemoteVersions(fetcher),
            metrics,
            head=lambda url: self.downloads.checked_info(url, fresh=True),
            learned=lambda url, asked, info: self.downloads.learned(url, asked, info),
            blocking=self._blocking,
            spawn=self.spawn,
            changed=self._notify,
            clock=clock,
            revalidate_after_s=revalidate_after_s,
            immutable=AllowList(immutable) if immutable else None,
            cancel=self._cancel,
        )
        self.indexer = PlanIndexer(planner)
        self._loops: list[asyncio.Task[Any]] = []
        self.hits = self.misses = self.bytes_served = 0

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the prefetcher and the housekeeping loop (call from the running loop)."""
        self._loops = [
            self.spawn(self.prefetcher.run()),
            self.spawn(self._housekeeping_loop()),
            self.spawn(self.indexer.run()),
            self.spawn(self.freshness.bulk.run()),
        ]
        # Remote clients are slow to set up (seconds for S3); do it now, off the loop, not on the first open.
        self._pool.submit(self.fetcher.warm_up, list(self.allow.prefixes))

    async def stop(self, deadline_s: float = 20.0) -> None:
        """Stop fetching: downloads notice the cancel flag within one chunk and remove their temp files."""
        self.begin_shutdown()
        for loop_task in self._loops:
            loop_task.cancel()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=deadline_s)
        for task in pending:
            task.cancel()
        self.owners.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _notify(self) -> None:
        """Space or leases changed: wake opens waiting for room, and the prefetcher."""
        self.space.changed()
        self.prefetcher.wake()

    def plans_changed(self) -> None:
        """Plans changed: look for shards to prefetch, and check the cache's size against the readers."""
        self.prefetcher.wake()
        self.sizing.check(self.planner.reader_count)

    def begin_shutdown(self) -> None:
        """Refuse new opens and tell downloads to stop; `stop` then waits for them."""
        self._closing = True
        self._cancel.set()
        self.owners.begin_shutdown()
        self._notify()

    @property
    def inflight(self) -> int:
        return len(self.downloads.inflight)

    @property
    def closing(self) -> bool:
        return self._closing

    def busy(self, url: str) -> bool:
        """Whether `url` is resident or being fetched."""
        return url in self.store.by_url or url in self.downloads.inflight

    def resident(self, url: str) -> bool:
        return url in self.store.by_url

    def inflight_future(self, url: str) -> asyncio.Future[Entry] | None:
        return self.downloads.inflight.get(url)

    # -- opens ------------------------------------------------------------------------------------------
    async def open(
        self,
        url: str,
        size: int | None = None,
        checksum: str | None = None,
        plan: str | None = None,
        peer: int | None = None,
        session: str | None = None,
    ) -> OpenGrant:
        """Make the shard local, lease it to `session` (else to process `peer`) and say where it is
        (`POST /v1/shards/open`).

        Raises:
            InsufficientCapacity: 507; `cache_pinned` at once when the open's job already pins its bound.
            NotFound: 404 `unknown_session`: the session named is not open (it ended, or the daemon
                restarted since it began).
        """
        started = time.perf_counter()
        live_session = self.owners.sessions.named(session)
        canonical = self.allow.check(url)
        # Recorded on arrival, not once the shard is local: while this open waits on a miss, its plan's
        # cursor must already be past the shard so the prefetch window moves on to what comes next.
        self.planner.record_open(canonical, plan)
        if plan is not None:
            self.prefetcher.wake()  # a hit outside any plan changes no prefetch window
        job = self.owners.job_of(plan, peer, live_session)
        self._within_bound(job, canonical)  # before a download the lease could not follow
        entry, result = await self.acquire(canonical, size, checksum, plan, job)
        self._within_bound(job, entry)
        lease = self.owners.lease(entry, job, peer, live_session)
        self.note_use(entry, result, "path", entry.size)
        self.metrics.open_wait.observe(time.perf_counter() - started)
        return OpenGrant(
            url=canonical, path=str(entry.path), size=entry.size, lease=lease, hit=result == "hit"
        )

    def note_use(self, entry: Entry, result: str, mode: str | None, served: int) -> None:
        """Count an open (hit or not; bytes handed over by path) and stamp the shard's use."""
        if result == "hit":
            self.hits += 1
        else:
            self.misses += 1
        self.metrics.requests_by[result].inc()
        if mode is not None:
            self.count_served(mode, served)
        if entry.prefetched and not entry.used:
            self.metrics.prefetched.labels("used").inc()
        entry.used = True
        entry.last_use = time.time()

    def count_served(self, mode: str, nbytes: int) -> None:
        self.bytes_served += nbytes
        self.metrics.served_by[mode].inc(nbytes)

    async def acquire(
        self,
        url: str,
        size: int | None,
        checksum: str | None,
        plan: str | None = None,
        job: str | None = None,
    ) -> tuple[Entry, str]:
        """The resident, valid entry of canonical `url` (fetched if need be) and how: hit/inflight/miss.

        `plan` and its `job`: a copy is served under a plan only once confirmed since the job began
        (freshness.py).

        Raises:
            InsufficientCapacity: no room for the shard (507); counted by its code.
        """
        try:
            return await self._acquire(url, size, checksum, plan, job)
        except InsufficientCapacity as exc:
            self._refused(exc.code)
            raise

    def _within_bound(self, job: str, shard: Entry | str) -> None:
        """Refuse (507 `cache_pinned`, counted) one more lease past the job's `--max-job-pinned`."""
        try:
            self.owners.check_bound(job, shard)
        except InsufficientCapacity as exc:
            self._refused(exc.code)
            raise

    def _refused(self, code: str) -> None:
        self.refusals[code] = self.refusals.get(code, 0) + 1
        self.metrics.refused_opens.labels(code).inc()

    async def _acquire(
        self, url: str, size: int | None, checksum: str | None, plan: str | None, job: str | None
    ) -> tuple[Entry, str]:
        result = "hit"
        for _ in range(8):
            if self._closing:
                raise ShuttingDown("the daemon is shutting down; retry shortly")
            entry = self.store.by_url.get(url)
            if entry is not None and not self.store.intact(entry):
                # Deleted, truncated or replaced behind the daemon's back: drop it and fetch it again.
                logger.warning("%s: its cache file %s is gone or damaged; fetching it again", url, entry.path)
                self.space.evict(url, "invalid")
                entry = None
            if (
                entry is not None
                and await self._still_valid(entry, size, plan, job)
                and await self.checksums.holds(entry, checksum)
            ):
                return entry, result
            future = self.downloads.inflight.get(url)
            if future is not None:
                result = "inflight" if result == "hit" else result
            else:
                result = "miss"
                future = self.start_fetch(url, size, checksum, demand=True)
            with self.space.awaiting(url):  # not a victim until leased
                try:
                    entry = await asyncio.shield(future)
                except NoRoom:
                    continue  # we joined a prefetch that gave up; fetch on demand
                except CacheDirMissing as exc:
                    if not self.cache_dir.check():  # drops the index and recreates the directory
                        raise CacheDirMissing(self.cache_dir.problem or exc.detail) from exc
                    continue  # fetch again into the recreated directory
            # The fetch may have finished a while ago; make sure it is still resident before leasing. A
            # joined prefetch fetched without this open's checksum: verify it as a hit would.
            if self.store.by_url.get(url) is entry and await self.checksums.holds(entry, checksum):
                return entry, result
        raise InsufficientCapacity(
            f"{url} was evicted repeatedly before it could be leased; the cache is thrashing"
        )

    async def _still_valid(self, entry: Entry, size: int | None, plan: str | None, job: str | None) -> bool:
        """Whether a resident shard may be served; checks the remote version when it must (freshness.py)."""
        if size is not None and size != entry.size:
            return False  # the fetch path re-reads the remote and reports the mismatch
        return await self.freshness.servable(entry, plan, job)

    async def revalidate(self, url: str) -> tuple[bool, bool]:
        """A client found `url` corrupt: compare the resident copy with the remote now (size, ETag, mtime)
        and evict it when the remote changed, so the next open fetches the fixed shard.

        Returns (resident, changed). Raises NotAllowed for a URL outside the allow-list, and the remote's
        errors (NotFound, RemoteError) as an open would.
        """
        canonical = self.allow.check(url)
        entry = self.store.by_url.get(canonical)
        if entry is None:
            return False, False
        asked, info = await self.downloads.checked_info(canonical, fresh=True)
        changed = cache_key(canonical, info.version) != entry.key
        if self.store.by_url.get(canonical) is not entry:
            return False, changed  # evicted or replaced meanwhile: the next open fetches it anyway
        if changed:
            logger.warning("%s: reported corrupt and changed on the remote; fetching it again", canonical)
            self.space.evict(canonical, "stale")
            self._notify()
        else:
            entry.validated_at, entry.suspect = max(entry.validated_at, asked), True
        return True, changed

    def start_fetch(
        self, url: str, size: int | None, checksum: str | None, *, demand: bool, warm: bool = False
    ) -> asyncio.Future[Entry]:
        return self.downloads.start(url, size, checksum, demand=demand, warm=warm)

    @property
    def bytes_fetched(self) -> int:
        return self.downloads.bytes_fetched

    # -- space ------------------------------------------------------------------------------------------
    def evict(self, url: str) -> None:
        """Remove one shard on request (`DELETE /v1/shards?url=`); leased files live on until released.

        Works on a shard in any state: resident (evicted), or already evicted but kept for its leases (no
        longer revived: the next open fetches it again).

        Raises:
            NotFound: the shard is neither resident nor kept for a lease (`not_resident`).
        """
        canonical = self.allow.check(url)
        kept = self.store.doomed_entry(canonical)
        if canonical in self.store.by_url or kept is None:
            self.space.evict(canonical, "manual")
        else:
            kept.no_revival = True
        self._notify()

    def trim(self) -> int:
        """Evict until the store fits its capacity and the disk its free-space floor; returns how many."""
        for entry in self.store.by_url.values():
            self.sizing.saw_shard(entry.size)
        return self.space.trim()

    @property
    def evictions(self) -> int:
        return self.space.evictions

    def release(self, *leases: str) -> bool:
        """End leases; True when any was live (unknown or expired ones are ignored)."""
        released = sum(self.store.release(lease) for lease in leases) > 0
        self._notify()  # an expired lease may have freed space too
        return released

    def warm(self, canonical: list[str]) -> list[str]:
        """Fetch `canonical` urls (allow-listed: planbody.read_prefetch) in the background
        (`POST /v1/prefetch`); returns them."""
        self.spawn(self.prefetcher.warm(canonical))
        return canonical

    def _lost(self, urls: list[str]) -> None:
        """The cache directory vanished with these shards: the planner forgets they were resident."""
        self.metrics.cache_dir_losses.inc()
        for url in urls:
            self.planner.forget(url)
        self._notify()

    async def _housekeeping_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(1.0)  # periodic housekeeping, not a readiness wait
            self.cache_dir.check()
            self.owners.sweep()
            expired = self.store.expire_leases()
            if expired:
                self.metrics.abandoned_leases.labels("ttl").inc(expired)
            if (expired + self.planner.retire_stale() + self.store.expire_partials()) > 0:
                self._notify()
            if self.planner.unindex_pending:  # stale plans, dropped here or inside a request
                self.indexer.wake()
            self.freshness.forget_ended()
            now = self._clock()
            self.downloads.forget_old_infos(now)
            self.prefetcher.forget_failures(now)
