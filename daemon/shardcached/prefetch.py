"""Fetching ahead of use: the plan-driven prefetcher and explicit warming (`POST /v1/prefetch`).

The prefetcher wakes whenever plans, opens, releases or fetch completions change something, asks the
planner for the nearest-needed shards that are neither resident nor in flight, bounded by the free fetch
slots (`--max-fetches` minus downloads in flight), and starts them as prefetches: a prefetch only takes
free space or evicts what the planner says is needed later (else it waits for the next change).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardcached.errors import DaemonError

if TYPE_CHECKING:
    from shardcached.service import ShardService

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 30.0  # a prefetch that failed (missing object, remote down) is not retried sooner


class NoRoom(Exception):
    """A prefetch found no space it may take; it waits for the next change."""


class Prefetcher:
    """Background prefetch loop and warming for one `ShardService`."""

    def __init__(self, service: ShardService, clock: Callable[[], float]) -> None:
        self._service = service
        self._clock = clock
        self._wake = asyncio.Event()
        self._failed: dict[str, float] = {}

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
            self._wake.clear()
            if service.closing:
                return
            slots = service.max_fetches - service.inflight
            if slots > 0:
                for url in service.planner.prefetch_candidates(self._skip, slots):
                    service.start_fetch(url, None, None, demand=False)

    async def warm(self, urls: list[str]) -> None:
        """Fetch `urls`, at most `max_fetches` at a time, evicting as a demand open would."""
        service = self._service
        gate = asyncio.Semaphore(service.max_fetches)

        async def one(url: str) -> None:
            async with gate:
                if service.closing or url in service.store.by_url:
                    return
                future = service.inflight_future(url) or service.start_fetch(
                    url, None, None, demand=True, warm=True
                )
                try:
                    await asyncio.shield(future)
                except DaemonError as exc:
                    logger.warning("warming %s failed: %s", url, exc.detail)
                except NoRoom:
                    pass

        await asyncio.gather(*(one(url) for url in urls))
