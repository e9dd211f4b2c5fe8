"""Plans enter and leave the planner's index in bounded steps on the event loop, never all at once.

The planner is pure and lock-free; this drives its chunked methods from one background task, yielding to
the loop between steps of at most `budget_s` (pieces of `chunk` urls until the budget is spent: a url's
cost varies with the machine, its load and the index's size, 1-4 us here, so a fixed count of urls is no
bound on the loop's time), so an open or a health check on another connection waits for at most one step.
A registration is answered once its plan's head (the first piece) is indexed: the plan is registered and
its first opens advance its cursor at once, and the rest is indexed long before a reader gets there (a
1M-url plan in a few seconds; a reader opens a few shards a second). Deleted and stale plans are dropped
from the planner at once; the resident shards they held are refiled by next use here afterwards, then their
bits are cleared. A decision needs the refile done (nextuse.py): one that comes first awaits `refiled`,
which refiles the rest in pieces too, so the wait falls on that download alone, never on the loop.

Nothing here hides objects from the garbage collector: the plans and the index are numpy arrays, which a
collection never walks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from shardcached.planning.planbody import PlanBody
from shardcached.planning.planner import Planner
from shardcached.planning.plans import Plan

logger = logging.getLogger(__name__)

CHUNK = (
    2000  # positions indexed or cleared at a time (vectorised, ~0.2-1 ms), repeated within a step's budget
)
REFILE_CHUNK = 8000  # resident shards of dropped plans refiled at a time, vectorised (~1-3 us each)
BUDGET_S = 0.004  # the loop's time one step may take, checked between pieces of `CHUNK` urls


async def refiled(planner: Planner, piece: int = REFILE_CHUNK) -> None:
    """Return once no dropped plan has resident shards left to refile, refiling them in pieces of `piece`
    with the loop free between two (the indexer works on them meanwhile as well).

    An eviction decision would settle them itself, in one loop step, which every hit on the node would wait
    for at 10^6 resident shards. Awaited, the refile's time falls on the open that needs room (it is about
    to download anyway). Returns without yielding when nothing is pending, so a caller that decides right
    after it sees everything refiled."""
    while planner.refile_pending:
        planner.refile_more(piece)
        await asyncio.sleep(0)


class PlanIndexer:
    """Indexes new plans and unindexes dropped ones in the background, in loop steps of at most `budget_s`
    (`chunk` urls at a time, `refile_chunk` resident shards of dropped plans refiled at a time; `clock`:
    seconds, injected so that tests can drive it)."""

    def __init__(
        self,
        planner: Planner,
        chunk: int = CHUNK,
        refile_chunk: int = REFILE_CHUNK,
        budget_s: float = BUDGET_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.planner = planner
        self.chunk = chunk
        self.refile_chunk = refile_chunk
        self.budget_s = budget_s
        self._clock = clock
        self._pending: deque[Plan] = deque()
        self._work = asyncio.Event()

    def register(self, body: PlanBody) -> Plan:
        """Register a plan and index its head now; the rest follows in the background (call on the loop)."""
        plan, fresh = self.planner.begin_plan(body.job, body.slot, body.epoch, body.arrays, body.digest)
        if fresh and not self.planner.index_more(plan, self.chunk):
            self._pending.append(plan)
        self.wake()  # a replaced plan may wait for unindexing too
        return plan

    @property
    def busy(self) -> bool:
        """Whether plans are still being indexed or unindexed."""
        return bool(self._pending) or self.planner.refile_pending or self.planner.unindex_pending

    def wake(self) -> None:
        """Plans were registered or dropped: look for work."""
        self._work.set()

    async def run(self) -> None:
        """Refile dropped plans' resident shards first (an eviction meanwhile would finish it on the loop),
        then index pending plans (their next uses matter), then clear dropped plans' bits."""
        while True:
            if self.step():
                await asyncio.sleep(0)  # let every ready request run between two steps
            else:
                self._work.clear()
                await self._work.wait()

    def step(self) -> bool:
        """One step of work, pieces of `chunk` urls until `budget_s` is spent; whether any work is left."""
        deadline = self._clock() + self.budget_s
        while True:
            if self.planner.refile_pending:
                self.planner.refile_more(self.refile_chunk)
            elif self._pending:
                if self.planner.index_more(self._pending[0], self.chunk):
                    self._pending.popleft()
            elif self.planner.unindex_pending:
                self.planner.unindex_more(self.chunk)
            if not self.busy or self._clock() >= deadline:
                return self.busy
