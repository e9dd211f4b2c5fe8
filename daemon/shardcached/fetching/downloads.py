"""Downloads: one fetch per shard in flight, from the remote's info to a published cache file.

A download asks the remote for the shard's size and version, makes room (`space.Space`), streams the
bytes into a temporary file in a thread (`fetcher.Fetcher.download`: resumable, checksummed, cancellable)
and publishes it atomically (`store.Store.finalize`). One asyncio future per URL gives single flight:
every open of a shard being fetched awaits the same download. The remote's info is cached for a short
while so that a prefetch that found no room does not ask the remote again on its next try.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from shardcached.errors import CacheDirMissing, DaemonError, IntegrityError, NoRoom, ShuttingDown
from shardcached.fetching.fetcher import Fetcher, RemoteInfo
from shardcached.keys import cache_key, file_suffix
from shardcached.metrics import Metrics
from shardcached.planning import Planner
from shardcached.storage import (
    CacheDirWatch,
    ChecksumCheck,
    Entry,
    SizingCheck,
    Space,
    Store,
    normalize_checksum,
)

logger = logging.getLogger(__name__)

INFO_TTL_S = 60.0  # how long a prefetch that found no room reuses the remote info it fetched


class Downloads:
    """The shards being fetched, and how one fetch runs; owned by the `ShardService`.

    Args:
        blocking: runs a blocking call in the service's thread pool.
        spawn: starts a task the service waits for at shutdown.
        done: called after every fetch that did not give up for want of room (space or leases changed).
        prefetch_failed: told of a failed prefetch (the prefetcher backs off that URL).
    """

    def __init__(
        self,
        store: Store,
        space: Space,
        planner: Planner,
        fetcher: Fetcher,
        metrics: Metrics,
        *,
        checksums: ChecksumCheck,
        cache_dir: CacheDirWatch,
        sizing: SizingCheck,
        blocking: Callable[..., Awaitable[Any]],
        spawn: Callable[[Any], asyncio.Task[Any]],
        done: Callable[[], None],
        prefetch_failed: Callable[[str, DaemonError], None],
        cancel: threading.Event,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.space = space
        self.planner = planner
        self.fetcher = fetcher
        self.metrics = metrics
        self.checksums = checksums
        self.cache_dir = cache_dir
        self.sizing = sizing
        self._blocking = blocking
        self._spawn = spawn
        self._done = done
        self._prefetch_failed = prefetch_failed
        self._cancel = cancel
        self._clock = clock
        self.inflight: dict[str, asyncio.Future[Entry]] = {}
        self._infos: dict[str, tuple[float, RemoteInfo]] = {}
        self.bytes_fetched = 0

    def start(
        self, url: str, size: int | None, checksum: str | None, *, demand: bool, warm: bool = False
    ) -> asyncio.Future[Entry]:
        """Start fetching canonical `url`; the future resolves to its published entry."""
        future: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
        # Nobody may be waiting (a prefetch); retrieve the exception so asyncio does not log it as lost.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.inflight[url] = future

        async def run() -> None:
            try:
                future.set_result(await self._fetch(url, size, checksum, demand=demand, warm=warm))
            except DaemonError as exc:
                if not demand:
                    self._prefetch_failed(url, exc)
                future.set_exception(exc)
            except BaseException as exc:  # handed to every waiter
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else ShuttingDown(str(exc)))
                if not isinstance(exc, Exception):
                    raise
            finally:
                self.inflight.pop(url, None)
                if not isinstance(future.exception() if not future.cancelled() else None, NoRoom):
                    self._done()

        self._spawn(run())
        return future

    async def info(self, url: str, *, fresh: bool) -> RemoteInfo:
        """The remote's size and version of `url`; `fresh` asks the remote, else a recent answer may do."""
        return (await self.checked_info(url, fresh=fresh))[1]

    async def checked_info(self, url: str, *, fresh: bool) -> tuple[float, RemoteInfo]:
        """`info`, with the clock time its request was sent: a copy of that version is confirmed as of
        then, not as of the answer (the object may have changed while the answer travelled)."""
        cached = self._infos.get(url)
        if not fresh and cached is not None and self._clock() - cached[0] < INFO_TTL_S:
            return cached
        asked = self._clock()
        info: RemoteInfo = await self._blocking(self.fetcher.info, url, self._cancel)
        self._infos[url] = (asked, info)
        return asked, info

    def learned(self, url: str, asked: float, info: RemoteInfo | None) -> None:
        """The remote answered for `url` elsewhere (a listing) as of `asked`: what a prefetch reuses
        (None: the object is gone). A prefetch must not download by an older answer: the bytes would not
        match its size."""
        cached = self._infos.get(url)
        if cached is not None and cached[0] > asked:
            return
        if info is None:
            self._infos.pop(url, None)
        else:
            self._infos[url] = (asked, info)

    def forget_old_infos(self, now: float) -> None:
        for url in [u for u, (at, _) in self._infos.items() if now - at > INFO_TTL_S]:
            del self._infos[url]

    async def _fetch(
        self, url: str, size: int | None, checksum: str | None, *, demand: bool, warm: bool
    ) -> Entry:
        asked, info = await self.checked_info(url, fresh=demand)
        if size is not None and size != info.size:
            self.metrics.fetch_errors.labels("size_mismatch").inc()
            raise IntegrityError(
                f"{url} has {info.size} bytes but the request says {size}; update the manifest",
                code="size_mismatch",
            )
        key = cache_key(url, info.version)
        if not demand and self.checksums.refused(url, key):
            raise IntegrityError(
                f"{url} failed its manifest checksum in this version; it is fetched again only when an open "
                f"asks for it or the object changes on the remote",
                code="checksum_mismatch",
            )
        checksum = normalize_checksum(checksum) if checksum is not None else None
        current = self.store.by_url.get(url)
        if current is not None and current.key == key and checksum in (None, current.checksum):
            current.validated_at = max(current.validated_at, asked)
            return current
        revived = self.store.revive(key, checksum)
        if revived is not None:
            revived.validated_at = max(revived.validated_at, asked)
            return revived
        if current is not None:
            self.space.evict(url, "stale")
        # A download a restart cut left its bytes; claimed first so that making room does not drop them.
        partial = self.store.claim_partial(key)
        try:
            await self.space.make_room(info.size, url, demand=demand, warm=warm)
        except BaseException:
            self.store.keep_partial(key)
            raise
        entry = Entry(
            key=key,
            url=url,
            version=info.version,
            size=info.size,
            path=self.store.cache_dir / (key + file_suffix(url)),
            checksum=checksum,
            validated_at=asked,
            prefetched=not demand or warm,
        )
        started = time.perf_counter()
        try:
            await self._download(url, entry, info, partial)
        except ShuttingDown:
            self.store.keep_partial(key)  # what the download kept, counted until the daemon exits
            raise
        except IntegrityError as exc:
            if exc.code == "checksum_mismatch":
                self.checksums.refuse(url, key)
            raise
        finally:
            self.store.unreserve(info.size)
        self.metrics.fetch_seconds.observe(time.perf_counter() - started)
        self.store.add(entry)
        self.planner.touch(url)
        if info.size > self.sizing.largest_shard:
            self.sizing.saw_shard(info.size)
            self.sizing.check(self.planner.reader_count)
        self._infos.pop(url, None)
        logger.info("fetched %s (%d bytes, %s)", url, info.size, "demand" if demand else "prefetch")
        return entry

    async def _download(self, url: str, entry: Entry, info: RemoteInfo, partial: Path | None) -> None:
        """Stream the bytes into a temporary file and publish it as `entry.path`."""
        tmp = self.store.temp_path(entry.key)
        await self._blocking(
            functools.partial(
                self.fetcher.download,
                version=info.version,
                resume_from=partial,
                keep_partial=self.store.partial_path(entry.key),
            ),
            url,
            tmp,
            info.size,
            entry.checksum,
            self._cancel,
            self._count_fetched,
        )
        try:
            await self._blocking(self.store.finalize, tmp, entry)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if self.cache_dir.present():
                raise
            raise CacheDirMissing(f"publishing {url} failed: {self.store.cache_dir} is gone") from exc

    def _count_fetched(self, nbytes: int) -> None:
        # Called from download threads; a counter increment is atomic enough for statistics.
        self.bytes_fetched += nbytes
        self.metrics.fetched_bytes.inc(nbytes)
