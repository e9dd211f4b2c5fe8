"""`GET /v1/shards` in pages ordered by url, without a pass over the resident set on the event loop.

Pages are cut from a sorted snapshot of the resident urls. The snapshot is taken when a walk starts (a
request without `after`, or the first one after a restart): one C-level copy of the store's keys on the
loop (a few ms at 1M), sorted in a worker thread in batches merged in Python, so the GIL passes to the loop
all along. A page then costs a bisect and `limit` lookups. A shard resident for the whole walk appears
exactly once; one that arrives or leaves during the walk may or may not.
"""

from __future__ import annotations

import asyncio
import heapq
from bisect import bisect_right

from shardcache_protocol import ShardInfo, ShardList
from shardcached.planning import Planner
from shardcached.storage import Store

DEFAULT_PAGE = 1_000
MAX_PAGE = 10_000
_SORT_BATCH = 10_000  # urls per C-level sort (a few ms of GIL)


class ShardListing:
    """Answers pages of the resident shards, ordered by url, from a snapshot per walk."""

    def __init__(self, store: Store, planner: Planner) -> None:
        self.store = store
        self.planner = planner
        self._sorted: list[str] | None = None

    async def page(self, after: str | None, limit: int) -> ShardList:
        """Up to `limit` resident shards whose url sorts after `after` (from the first when None)."""
        snapshot = self._sorted
        if after is None or snapshot is None:
            snapshot = self._sorted = await asyncio.to_thread(sorted_in_batches, list(self.store.by_url))
        i = 0 if after is None else bisect_right(snapshot, after)
        shards: list[ShardInfo] = []
        by_url = self.store.by_url
        while i < len(snapshot) and len(shards) < limit:
            url = snapshot[i]
            i += 1
            entry = by_url.get(url)
            if entry is None:
                continue  # left the cache since the snapshot
            shards.append(
                ShardInfo(
                    url=url,
                    size=entry.size,
                    last_use=entry.last_use,
                    next_use=self.planner.next_use(url),
                    pinned=entry.leases > 0,
                    leases=entry.leases,
                )
            )
        more = i < len(snapshot)  # the page is full; later urls may all have left since, though
        return ShardList(shards=shards, next_after=shards[-1].url if more else None)


def sorted_in_batches(urls: list[str]) -> list[str]:
    """`sorted(urls)`, in batches of C-level sorts merged in Python (blocking; for a worker thread)."""
    runs = [sorted(urls[i : i + _SORT_BATCH]) for i in range(0, len(urls), _SORT_BATCH)]
    return runs[0] if len(runs) == 1 else list(heapq.merge(*runs))
