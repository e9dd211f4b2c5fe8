"""Fetching ahead of use: the plan-driven prefetcher and explicit warming (`POST /v1/prefetch`).

The prefetcher wakes whenever plans, opens, releases or fetch completions change something, asks the
planner for the nearest-needed shards that are neither resident nor in flight, bounded by the free fetch
slots (`--max-fetches` minus downloads in flight), and starts them as prefetches: a prefetch only takes
free space or evicts what the planner says is needed later (else it waits for the next change).

The scheduler runs at most once per `MIN_GAP_S` and spends at most ~1/`DUTY` of the CPU: ranking the
prefetch windows costs up to ~1 ms with a hundred plans, and running it after every open would double the
cost of a hit. Opens that arrive in between coalesce into the next run. Warming is a prefetch too: it may
not evict planned shards to bring in shards no plan asked for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from shardcached.errors import DaemonError, NoRoom

if TYPE_CHECKING:
    from shardcached.planning import Planner
    from shardcached.storage import Entry

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 30.0  # a prefetch that failed (missing object, remote down) is not retried sooner
MIN_GAP_S = 0.002  # at most one scheduler run per this many seconds
DUTY = 10  # the pause after a run is at least DUTY times its duration


class FetchHost(Protocol):
    """What the prefetcher needs of the service: its fetch slots and a way to start fetches."""

    max_fetches: int

    @property
    def closing(self) -> bool: ...

    @property
    def inflight(self) -> int: ...

    def busy(self, url: str) -> bool:
        """Whether `url` is resident or being fetched."""
        ...

    def resident(self, url: str) -> bool: ...

    def inflight_future(self, url: str) -> asyncio.Future[Entry] | None: ...

    def start_fetch(
        self, url: str, size: int | None, checksum: str | None, *, demand: bool, warm: bool = False
    ) -> asyncio.Future[Entry]: ...


class Prefetcher:
    """Background prefetch loop and warming for one fetch host (the `ShardService`)."""

    def __init__(self, service: FetchHost, planner: Planner, clock: Callable[[], float]) -> None:
        self._service = service
        self._planner = planner
        self._clock = clock
        self._wake = asyncio.Event()
        self._failed: dict[str, float] = {}
        self._not_before = 0.0  # perf_counter time before which the scheduler does not run again
        self.runs = 0

    def wake(self) -> None:
        self._wake.set()

    def note_failure(self, url: str, exc: DaemonError) -> None:
        logger.warning("prefetch of %s failed: %s", url, exc.detail)
        self._failed[url] = self._clock() + RETRY_AFTER_S

    def forget_failures(self, now: float) -> None:
        for url in [u for u, at in self._failed.items() if now > at]:
            del self._failed[url]

    def _skip(self, url: str) -> bool:
        if self._service.busy(url):
            return True
        retry_at = self._failed.get(url)
        return retry_at is not None and self._clock() < retry_at

    async def run(self) -> None:
        service = self._service
        while not service.closing:
            await self._wake.wait()
            pause = self._not_before - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)  # rate limit: wake-ups meanwhile coalesce into this run
            self._wake.clear()
            if service.closing:
                return
            started = time.perf_counter()
            self.schedule()
            ended = time.perf_counter()
            self._not_before = ended + max(MIN_GAP_S, DUTY * (ended - started))

    def schedule(self) -> None:
        """Start prefetches of the nearest-needed shards into the free fetch slots."""
        service = self._service
        self.runs += 1
        slots = service.max_fetches - service.inflight
        if slots > 0:
            for url in self._planner.prefetch_candidates(self._skip, slots):
                service.start_fetch(url, None, None, demand=False)

    async def warm(self, urls: list[str]) -> None:
        """Fetch `urls`, at most `max_fetches` at a time, evicting only shards no plan needs sooner."""
        service = self._service
        gate = asyncio.Semaphore(service.max_fetches)

        async def one(url: str) -> None:
            async with gate:
                if service.closing or service.resident(url):
                    return
                future = service.inflight_future(url) or service.start_fetch(
                    url, None, None, demand=False, warm=True
                )
                try:
                    await asyncio.shield(future)
                except DaemonError as exc:
                    logger.warning("warming %s failed: %s", url, exc.detail)
                except NoRoom:
                    logger.info("not warming %s: no room without evicting shards the plans need", url)

        await asyncio.gather(*(one(url) for url in urls))
