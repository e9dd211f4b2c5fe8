"""Plans enter and leave the planner's index in bounded steps on the event loop, never all at once.

The planner is pure and lock-free; this drives its chunked methods from one background task, yielding to
the loop between steps of `chunk` urls (~5 ms), so an open or a health check on another connection waits
for at most one step. A registration is answered once its plan's head (the first step) is indexed: the
plan is registered and its first opens advance its cursor at once, and the rest is indexed long before a
reader gets there (a 1M-url plan in about a second; a reader opens a few shards a second). Deleted and stale
plans are dropped from the planner at once and their entries removed here afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import deque

from shardcached.planbody import PlanBody
from shardcached.planner import Planner
from shardcached.plans import Plan

logger = logging.getLogger(__name__)

CHUNK = 5_000  # urls indexed or unindexed per step: a few ms of the loop
FREEZE_AT = 50_000  # a plan this long moves the live objects out of the garbage collector's generations


def _freeze() -> None:
    """Move every object the collector tracks now into its permanent generation (`gc.freeze`).

    The position index (url -> plan -> position) is one dict of up to millions of entries, and a new plan's
    url list another million-slot container: every collection of their generation walks them (~85-170 ms
    at 1M urls here, with the GIL: a health check waited 126 ms). Frozen, no collection walks them again;
    entries added later are small untracked dicts. Objects freed by reference counting still go at once;
    what a freeze keeps is cyclic garbage not yet collected at that moment (a young generation's worth),
    once per long plan registered.
    """
    gc.freeze()
    logger.debug("froze the collector's objects: %d permanent", gc.get_freeze_count())


class PlanIndexer:
    """Indexes new plans and unindexes dropped ones in the background, `chunk` urls per loop step."""

    def __init__(self, planner: Planner, chunk: int = CHUNK, freeze_at: int = FREEZE_AT) -> None:
        self.planner = planner
        self.chunk = chunk
        self.freeze_at = freeze_at
        self._pending: deque[Plan] = deque()
        self._work = asyncio.Event()

    def register(self, body: PlanBody) -> Plan:
        """Register a plan and index its head now; the rest follows in the background (call on the loop)."""
        plan, fresh = self.planner.begin_plan(body.job, body.slot, body.epoch, body.urls, body.digest)
        if fresh and not self.planner.index_more(plan, self.chunk):
            self._pending.append(plan)
        if fresh and len(plan.urls) >= self.freeze_at:
            _freeze()
        self.wake()  # a replaced plan may wait for unindexing too
        return plan

    @property
    def busy(self) -> bool:
        """Whether plans are still being indexed or unindexed."""
        return bool(self._pending) or self.planner.unindex_pending

    def wake(self) -> None:
        """Plans were registered or dropped: look for work."""
        self._work.set()

    async def run(self) -> None:
        """Index pending plans first (their next uses matter), then remove dropped plans' entries."""
        while True:
            if self.step():
                await asyncio.sleep(0)  # let every ready request run between two steps
            else:
                self._work.clear()
                await self._work.wait()

    def step(self) -> bool:
        """One bounded step of work; whether any work is left."""
        if self._pending:
            if self.planner.index_more(self._pending[0], self.chunk):
                self._pending.popleft()
        elif self.planner.unindex_pending:
            self.planner.unindex_more(self.chunk)
        return self.busy
