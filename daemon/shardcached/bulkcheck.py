"""Checking many cached copies against the remote in the background: chunks of listing pages, in plan order.

For a plan, a worker thread gathers the resident copies confirmed before a given moment (`gather_chunks`:
a pass over the plan), grouped by directory and cut into chunks of up to 1,000 sorted urls; `WORKERS` tasks
check the chunks, the chunk holding the plan's earliest position first, each page by page (versions.py:
one request answers for up to 1,000 objects on S3). On the event loop only the filing of a chunk (up to
1,000 urls a step) and the settling of a page run. What the answers mean (a copy confirmed or dropped) is
the caller's (freshness.py): this module only runs the checks and says which page is in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardcached.errors import DaemonError
from shardcached.fetching.fetcher import RemoteInfo
from shardcached.keys import AllowList
from shardcached.storage.layout import Entry
from shardcached.storage.store import Store
from shardcached.versions import PAGE, Page, RemoteVersions, directory, listed

logger = logging.getLogger(__name__)

WORKERS = 4  # chunks checked at once, each one request at a time
SMOOTHING = 0.2  # weight of the latest duration in a running estimate of a request's time


@dataclass(eq=False)
class Chunk:
    """Up to `PAGE` copies checked together: one directory's urls sorted (listed remotes) or urls in plan
    order (the others). `first`: the earliest plan position among them; chunks run in that order."""

    urls: list[str]
    first: int
    started_at: float | None = None
    page: asyncio.Future[None] | None = None  # the request in flight: opens of these urls may wait for it
    page_asked: float = 0.0  # when it was sent


def gather_chunks(
    urls: Sequence[str], resident: Mapping[str, Entry], since: float, immutable: AllowList | None
) -> list[Chunk]:
    """The copies among `urls` (a plan, in order) that are resident and confirmed before `since`, as chunks
    in plan order. Blocking, a pass over the plan, for a worker thread: `resident` and its entries are only
    read (a copy confirmed meanwhile is dropped from its chunk when the chunk is queued)."""
    position_of: dict[str, int] = {}
    # Iterating the plan's own list: if the plan is dropped meanwhile and its list emptied from the end,
    # the iteration just stops early.
    for position, url in enumerate(urls):
        if url in position_of:
            continue
        entry = resident.get(url)
        if entry is None or entry.validated_at >= since:
            continue
        if immutable is None or not immutable.allows(url):
            position_of[url] = position
    by_directory: dict[str, list[str]] = {}
    unlisted: list[str] = []
    for url in position_of:
        if listed(url):
            by_directory.setdefault(directory(url), []).append(url)
        else:
            unlisted.append(url)
    chunks: list[Chunk] = []
    for members in by_directory.values():
        members.sort()
        for start in range(0, len(members), PAGE):
            part = members[start : start + PAGE]
            chunks.append(Chunk(part, min(position_of[url] for url in part)))
    for start in range(0, len(unlisted), PAGE):
        part = unlisted[start : start + PAGE]
        chunks.append(Chunk(part, position_of[part[0]]))
    chunks.sort(key=lambda chunk: chunk.first)
    return chunks


def smoothed(estimate: float | None, seen: float) -> float:
    """A running estimate of a duration after seeing another one."""
    return seen if estimate is None else estimate + SMOOTHING * (seen - estimate)


class BulkCheck:
    """The chunks queued and running, and the workers that check them.

    Args:
        settle: told each version a page found for a resident copy, and when the page was asked.
        gone: told of a url a request says no longer exists, and when it was asked.
        head: HEADs a url a listing did not show where it should, joining one asked at or after the given
            moment (raises the remote's errors).
        blocking: runs a blocking call in the service's thread pool.
        immutable: prefixes of urls never checked; None: none.
        cancel: set at shutdown; stops the retries of a listing.
    """

    def __init__(
        self,
        store: Store,
        versions: RemoteVersions,
        *,
        settle: Callable[[Entry, RemoteInfo, float], None],
        gone: Callable[[str, float], None],
        head: Callable[[str, float], Awaitable[None]],
        blocking: Callable[..., Awaitable[Any]],
        clock: Callable[[], float],
        immutable: AllowList | None,
        cancel: threading.Event,
    ) -> None:
        self._store = store
        self._versions = versions
        self._settle = settle
        self._gone = gone
        self._head = head
        self._blocking = blocking
        self._clock = clock
        self._immutable = immutable
        self._cancel = cancel
        self._chunk_of: dict[str, Chunk] = {}  # url -> the chunk queued or running that will check it
        self._queue: list[tuple[int, int, Chunk]] = []  # (first position, arrival, chunk): a heap
        self._arrivals = itertools.count()
        self._ready = asyncio.Event()
        self.pending = 0  # copies in chunks queued or running (`shardcache_validation_pending_shards`)
        self.page_s: float | None = None  # how long a page takes, smoothed; None: none seen yet

    def in_flight(self, url: str) -> Chunk | None:
        """The chunk holding `url`, when it has a page in flight."""
        chunk = self._chunk_of.get(url)
        return chunk if chunk is not None and chunk.page is not None else None

    async def plan(self, urls: Sequence[str], since: float) -> None:
        """Queue the checks of a plan's copies confirmed before `since` (gathered in a worker thread)."""
        chunks: list[Chunk] = await self._blocking(
            gather_chunks, urls, self._store.by_url, since, self._immutable
        )
        for chunk in chunks:
            self._enqueue(chunk, since)
            await asyncio.sleep(0)  # up to PAGE urls per loop step

    def _enqueue(self, chunk: Chunk, since: float) -> None:
        """Queue `chunk` without the copies confirmed meanwhile or that a chunk queued, or one asked after
        `since`, will confirm."""
        kept = []
        by_url = self._store.by_url
        for url in chunk.urls:
            other = self._chunk_of.get(url)
            if other is not None and (other.started_at is None or other.started_at >= since):
                continue
            entry = by_url.get(url)
            if entry is not None and entry.validated_at < since:
                self._chunk_of[url] = chunk
                kept.append(url)
        if kept:
            chunk.urls = kept
            self.pending += len(kept)
            heapq.heappush(self._queue, (chunk.first, next(self._arrivals), chunk))
            self._ready.set()

    async def run(self) -> None:
        """Check queued chunks, `WORKERS` at a time, until cancelled (the service's background loop)."""
        await asyncio.gather(*(self._work() for _ in range(WORKERS)))

    async def _work(self) -> None:
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            _, _, chunk = heapq.heappop(self._queue)
            await self._check(chunk)

    async def _check(self, chunk: Chunk) -> None:
        """Ask the remote for the chunk's versions, page by page; HEAD what the listings did not show."""
        loop = asyncio.get_running_loop()
        started = chunk.started_at = self._clock()
        urls, done, after = chunk.urls, 0, None
        unlisted: list[str] = []
        try:
            while done < len(urls):
                in_flight = chunk.page = loop.create_future()
                asked = chunk.page_asked = self._clock()
                try:
                    page: Page = await self._blocking(self._versions.page, urls[done:], after, self._cancel)
                except DaemonError as exc:
                    logger.warning(
                        "checking %d cached shards from %s failed: %s; each is checked when next opened",
                        len(urls) - done,
                        urls[done],
                        exc.detail,
                    )
                    return
                finally:
                    in_flight.set_result(None)
                self.page_s = smoothed(self.page_s, self._clock() - asked)
                self._settle_page(page, asked)
                for url in urls[done : done + page.covered]:
                    if url not in page.found:
                        if page.confirmed:
                            self._gone(url, asked)
                        else:
                            unlisted.append(url)
                after = page.last if page.covered == 0 else None
                done += page.covered
            chunk.page = None
            for url in unlisted:  # not in the listing where it should be: a HEAD tells gone from unlisted
                try:
                    await self._head(url, started)
                except DaemonError as exc:
                    logger.info("checking %s: %s", url, exc.detail)
        finally:
            chunk.page = None
            for url in urls:
                if self._chunk_of.get(url) is chunk:
                    del self._chunk_of[url]
            self.pending -= len(urls)

    def _settle_page(self, page: Page, asked: float) -> None:
        by_url = self._store.by_url
        for url, info in page.found.items():
            entry = by_url.get(url)
            if entry is not None:
                self._settle(entry, info, asked)
