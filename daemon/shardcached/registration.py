"""Which plans are registered: plans entering and leaving, each (job, slot)'s chain, expiry and pace.

The planner (planner.py) decides with what this holds; this module only keeps it. A plan of one (job, slot)
joins that slot's chain; the same (job, slot, epoch) again with the same urls is the same plan (a client
re-registers after reconnecting), with other urls it replaces the plan. A chain with no open and no new plan
for `stale_after_s` loses its plans.

Registration and deletion come in two speeds. ``add_plan`` / ``delete_plan`` / ``expire_stale`` do the whole
work at once (tests, simulations). The daemon instead calls ``begin_plan`` then ``index_more`` in bounded
steps, and ``drop_plan`` / ``retire_stale`` then ``unindex_more``, so that no step is proportional to a
plan's length: a dropped plan is gone at once for every question the planner asks, and its index entries
are garbage removed later (lookups skip plan ids that are no longer live).

Every url entering or leaving the position index, and every plan dropped, is told to a `Listener` (the
planner's next-use index), so that the resident shards' order follows. Pure: no I/O, no asyncio, an
injected clock.
"""

from __future__ import annotations

import logging
import math
import statistics
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from shardcached.plans import Chain, Plan, Positions, index_plan, index_range, unindex_range

logger = logging.getLogger(__name__)

_DEFAULT_INTERVAL = 1.0  # seconds between opens assumed while no slot has a pace yet


class Listener(Protocol):
    """What must follow the registered plans (nextuse.NextUseIndex)."""

    def replan(self, url: str, chain: Chain) -> None:
        """`url`'s uses in `chain` may have changed (indexed or unindexed)."""

    def dropped(self, chain: Chain, epoch: int) -> None:
        """`chain`'s plan for `epoch` is no longer live."""


class PlanRegistry:
    """The live plans, their chains and position index, the dropped plans still in it, expiry and pace.

    Args:
        stale_after_s: a (job, slot) with no open and no new plan for this long loses its plans.
        clock: monotonic seconds, injected so that tests drive time.
        listener: told of every url (un)indexed and every plan dropped.
    """

    def __init__(self, stale_after_s: float, clock: Callable[[], float], listener: Listener) -> None:
        self.stale_after_s = stale_after_s
        self.plans: dict[str, Plan] = {}
        self.chains: dict[tuple[str, int], Chain] = {}
        self.positions = Positions()  # url -> plan id -> position(s): see plans.py
        self._clock = clock
        self._listener = listener
        self._retired: deque[Plan] = deque()  # dropped plans whose index entries are not all removed yet
        self._ref_interval: float | None = None  # cached median interval; None = recompute
        self._expiry_check_at = math.inf  # no chain can be stale before this time

    def add_plan(self, job: str, slot: int, epoch: int, urls: Sequence[str]) -> str:
        """`begin_plan`, the whole plan indexed and every dropped plan unindexed at once; the plan id."""
        plan, fresh = self.begin_plan(job, slot, epoch, list(urls))  # a copy: see begin_plan
        if fresh:
            index_plan(self.positions, plan, self._replanner(plan.chain))
        self.unindex_more(math.inf)
        return plan.id

    def begin_plan(
        self, job: str, slot: int, epoch: int, urls: list[str], digest: str | None = None
    ) -> tuple[Plan, bool]:
        """Register a plan without indexing its urls: (plan, whether it still needs `index_more`).

        An identical registration returns the existing plan (and False). `digest`, a hash of `urls`
        computed by the caller, makes that comparison O(1); without it the urls are compared. The plan
        counts as registered at once; its urls count for next uses as `index_more` reaches them.
        The plan takes `urls` over: once it is dropped, `unindex_more` empties the list from its end.
        """
        now = self._clock()
        self.maybe_expire(now)
        chain = self.chains.get((job, slot))
        if chain is None:
            chain = self.chains[(job, slot)] = Chain(job, slot)
        chain.last_activity = now
        self._expiry_check_at = min(self._expiry_check_at, now + self.stale_after_s)
        for plan in chain.plans:
            if plan.epoch == epoch:
                same = plan.digest == digest if digest is not None else plan.urls == urls
                if same and len(plan.urls) == len(urls):
                    return plan, False
                self.drop_plan(plan.id)
                break
        # Dropping the chain's only plan removed the chain; the new plan keeps it (and its pace) alive.
        self.chains[(job, slot)] = chain
        plan = Plan(uuid.uuid4().hex, chain, epoch, urls, digest=digest)
        self.plans[plan.id] = plan
        chain.plans.append(plan)
        chain.plans.sort(key=lambda p: p.epoch)
        logger.debug("plan %s: job=%s slot=%d epoch=%d urls=%d", plan.id, job, slot, epoch, len(urls))
        return plan, True

    def index_more(self, plan: Plan, budget: int) -> bool:
        """Index up to `budget` more urls of `plan`, in order; True once nothing is left to index (the plan
        is fully indexed, or was dropped meanwhile)."""
        if self.plans.get(plan.id) is not plan:
            return True
        stop = min(len(plan.urls), plan.indexed + budget)
        index_range(self.positions, plan, plan.indexed, stop, self._replanner(plan.chain))
        plan.indexed = stop
        return stop == len(plan.urls)

    def delete_plan(self, plan_id: str) -> bool:
        """`drop_plan`, its index entries removed at once; False if the id is unknown."""
        if not self.drop_plan(plan_id):
            return False
        self.unindex_more(math.inf)
        return True

    def drop_plan(self, plan_id: str) -> bool:
        """Forget a plan now and leave its index entries to `unindex_more`; False if the id is unknown."""
        plan = self.plans.pop(plan_id, None)
        if plan is None:
            return False
        self._retired.append(plan)
        chain = plan.chain
        chain.plans.remove(plan)
        # O(resident shards of the plan), not O(its urls): eviction stays exact while the index is cleaned.
        self._listener.dropped(chain, plan.epoch)
        if not chain.plans:
            self.chains.pop((chain.job, chain.slot), None)
            self._ref_interval = None
        return True

    def unindex_more(self, budget: float) -> bool:
        """Remove up to `budget` index entries of dropped plans; True once none is left."""
        retired = self._retired
        while retired and budget > 0:
            plan = retired[0]
            urls = plan.urls
            # The list is emptied from its end as it goes (the part never indexed first): freed whole, a
            # million strings would go in one step (~40-60 ms here).
            if len(urls) > plan.indexed:
                cut = max(plan.indexed, len(urls) - int(min(budget, len(urls))))
                budget -= len(urls) - cut
                del urls[cut:]
                continue
            start = max(0, plan.indexed - int(min(budget, plan.indexed)))
            unindex_range(self.positions, plan, start, plan.indexed, self._replanner(plan.chain))
            budget -= plan.indexed - start
            plan.indexed = start
            del urls[start:]
            if start == 0:
                retired.popleft()
        return not retired

    @property
    def unindex_pending(self) -> bool:
        """Whether dropped plans still have entries in the index (see `unindex_more`)."""
        return bool(self._retired)

    def orphan(self, plan_id: str, grace_s: float) -> bool:
        """Drop `plan_id`'s (job, slot)'s plans after `grace_s` unless an open or a new registration shows
        the slot is read on; False for an unknown id."""
        plan = self.plans.get(plan_id)
        if plan is None:
            return False
        now = self._clock()
        chain = plan.chain
        chain.last_activity = min(chain.last_activity, now + grace_s - self.stale_after_s)
        self._expiry_check_at = min(self._expiry_check_at, now + grace_s)
        return True

    def ending(self, plan_id: str, within_s: float) -> bool:
        """Whether `plan_id` is gone or will be dropped within `within_s` unless its slot shows activity:
        its holder exited (`orphan`), or its slot has been idle for nearly `stale_after_s`."""
        plan = self.plans.get(plan_id)
        return plan is None or plan.chain.last_activity + self.stale_after_s - self._clock() <= within_s

    def expire_stale(self) -> int:
        """`retire_stale`, the index entries removed at once; how many plans went."""
        dropped = self.retire_stale()
        self.unindex_more(math.inf)
        return dropped

    def retire_stale(self) -> int:
        """Drop the plans of every (job, slot) idle for `stale_after_s`, leaving their index entries to
        `unindex_more`: O(plans), whatever their length. Returns how many plans went."""
        now = self._clock()
        dropped = 0
        earliest = math.inf
        for chain in list(self.chains.values()):
            if now - chain.last_activity >= self.stale_after_s:
                for plan in list(chain.plans):
                    self.drop_plan(plan.id)
                    dropped += 1
                logger.info("dropped stale plans of job=%s slot=%d", chain.job, chain.slot)
            else:
                earliest = min(earliest, chain.last_activity + self.stale_after_s)
        self._expiry_check_at = earliest
        return dropped

    def maybe_expire(self, now: float) -> None:
        """`retire_stale` if a chain may be stale at `now`. Amortised O(1): the earliest moment any chain can
        go stale only moves forward. Inside a request: drop only, the index entries go later."""
        if now >= self._expiry_check_at:
            self.retire_stale()

    def pace_changed(self) -> None:
        """A chain's interval changed: the reference interval is recomputed when next asked."""
        self._ref_interval = None

    def reference_interval(self) -> float:
        """The median interval of the chains that have one: the pace of a chain that has none yet."""
        if self._ref_interval is None:
            known = [c.interval for c in self.chains.values() if c.interval is not None]
            self._ref_interval = statistics.median(known) if known else _DEFAULT_INTERVAL
        return self._ref_interval

    def describe(self) -> list[dict[str, object]]:
        """The live plans, for debugging: id, job, slot, epoch, cursor, len, interval_s, last_open."""
        return [
            {
                "id": plan.id,
                "job": plan.chain.job,
                "slot": plan.chain.slot,
                "epoch": plan.epoch,
                "cursor": plan.cursor,
                "len": len(plan.urls),
                "interval_s": plan.chain.interval,
                "last_open": plan.chain.last_open,
            }
            for chain in self.chains.values()
            for plan in chain.plans
        ]

    def _replanner(self, chain: Chain) -> Callable[[str], None]:
        """The per-url hook of (un)indexing a plan of `chain`."""
        replan = self._listener.replan
        return lambda url: replan(url, chain)
