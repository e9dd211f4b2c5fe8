"""Which plans are registered: plans entering and leaving, each (job, slot)'s chain, expiry and pace.

The planner (planner.py) decides with what this holds; this module only keeps it. A plan of one (job, slot)
joins that slot's chain; the same (job, slot, epoch) again with the same urls is the same plan (a client
re-registers after reconnecting), with other urls it replaces the plan. A chain with no open and no new plan
for `stale_after_s` loses its plans.

Registration and deletion come in two speeds. ``add_plan`` / ``delete_plan`` / ``expire_stale`` do the whole
work at once (tests, simulations). The daemon instead calls ``begin_plan`` then ``index_more`` in bounded
steps, and ``drop_plan`` / ``retire_stale`` then ``unindex_more``, so that no step is proportional to a
plan's length: a dropped plan is gone at once for every question the planner asks (planindex.py), and its
bits in the index are cleared later.

Every chunk of url ids a plan starts holding, and every plan dropped, is told to a `Listener` (the
planner's next-use index), so that the resident shards' order follows. Pure: no I/O, no asyncio, an
injected clock.
"""

from __future__ import annotations

import logging
import math
import statistics
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardcached.planning.planindex import PlanIndex
from shardcached.planning.plans import Chain, Plan, PlanArrays, PlanUrls
from shardcached.planning.urltable import UrlTable

logger = logging.getLogger(__name__)

_DEFAULT_INTERVAL = 1.0  # seconds between opens assumed while no slot has a pace yet


class Listener(Protocol):
    """What must follow the registered plans (nextuse.NextUseIndex)."""

    def indexed(self, uids: npt.NDArray[np.int64]) -> None:
        """A plan now holds `uids` (distinct)."""

    def dropped(self, plan: Plan) -> None:
        """`plan` is no longer live."""


class PlanRegistry:
    """The live plans, their chains, expiry and pace.

    Args:
        stale_after_s: a (job, slot) with no open and no new plan for this long loses its plans.
        clock: monotonic seconds, injected so that tests drive time.
        table: the urls' ids.
        index: which live plans hold each url (its entries follow the plans registered here).
        listener: told of every chunk of urls indexed and every plan dropped.
    """

    def __init__(
        self,
        stale_after_s: float,
        clock: Callable[[], float],
        table: UrlTable,
        index: PlanIndex,
        listener: Listener,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.plans: dict[str, Plan] = {}
        self.chains: dict[tuple[str, int], Chain] = {}
        self._table = table
        self._index = index
        self._clock = clock
        self._listener = listener
        self._ref_interval: float | None = None  # cached median interval; None = recompute
        self._expiry_check_at = math.inf  # no chain can be stale before this time

    def add_plan(self, job: str, slot: int, epoch: int, urls: Sequence[str]) -> str:
        """`begin_plan`, the whole plan indexed and every dropped plan cleaned at once; the plan id."""
        plan, fresh = self.begin_plan(job, slot, epoch, PlanArrays.from_urls(self._table, urls))
        if fresh:
            self.index_more(plan, len(plan))
        self.unindex_more(math.inf)
        return plan.id

    def begin_plan(
        self, job: str, slot: int, epoch: int, arrays: PlanArrays, digest: str | None = None
    ) -> tuple[Plan, bool]:
        """Register a plan without indexing its urls: (plan, whether it still needs `index_more`).

        An identical registration returns the existing plan (and False). `digest`, a hash of the urls
        computed by the caller, makes that comparison O(1); without it the ids are compared. The plan
        counts as registered at once (its cursor moves with opens); its urls count for next uses as
        `index_more` reaches them.
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
                if digest is not None:
                    same = plan.digest == digest and len(plan) == len(arrays.ids)
                else:
                    same = np.array_equal(plan.ids, arrays.ids)
                if same:
                    return plan, False
                self.drop_plan(plan.id)
                break
        # Dropping the chain's only plan removed the chain; the new plan keeps it (and its pace) alive.
        self.chains[(job, slot)] = chain
        plan = Plan(uuid.uuid4().hex, chain, epoch, arrays, PlanUrls(arrays.ids, self._table), digest=digest)
        self.plans[plan.id] = plan
        chain.plans.append(plan)
        chain.plans.sort(key=lambda p: p.epoch)
        self._index.add(plan)
        logger.debug("plan %s: job=%s slot=%d epoch=%d urls=%d", plan.id, job, slot, epoch, len(plan))
        return plan, True

    def index_more(self, plan: Plan, budget: int) -> bool:
        """Index up to `budget` more positions of `plan`, in order; True once nothing is left to index
        (the plan is fully indexed, or was dropped meanwhile)."""
        if self.plans.get(plan.id) is not plan:
            return True
        uids = self._index.index_more(plan, budget)
        self._listener.indexed(uids)
        return plan.indexed == len(plan)

    def delete_plan(self, plan_id: str) -> bool:
        """`drop_plan`, its index entries removed at once; False if the id is unknown."""
        if not self.drop_plan(plan_id):
            return False
        self.unindex_more(math.inf)
        return True

    def drop_plan(self, plan_id: str) -> bool:
        """Forget a plan now (O(1) in its length) and leave its bits in the index to `unindex_more`;
        False if the id is unknown."""
        plan = self.plans.pop(plan_id, None)
        if plan is None:
            return False
        chain = plan.chain
        chain.plans.remove(plan)
        self._listener.dropped(plan)
        self._index.drop(plan)
        if not chain.plans:
            self.chains.pop((chain.job, chain.slot), None)
            self._ref_interval = None
        return True

    def unindex_more(self, budget: float) -> bool:
        """Clear up to `budget` positions' bits of dropped plans in the index; True once none is left."""
        return self._index.clean_more(int(min(budget, 1 << 62)))

    @property
    def unindex_pending(self) -> bool:
        """Whether dropped plans still have bits in the index (see `unindex_more`)."""
        return self._index.clean_pending

    def plan(self, plan_id: str) -> Plan | None:
        """The live plan `plan_id`, or None."""
        return self.plans.get(plan_id)

    @property
    def plan_count(self) -> int:
        return len(self.plans)

    def readers(self) -> list[Chain]:
        """The (job, slot) chains with a live plan: the readers that may read concurrently."""
        return list(self.chains.values())

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
                "len": len(plan),
                "interval_s": plan.chain.interval,
                "last_open": plan.chain.last_open,
            }
            for chain in self.chains.values()
            for plan in chain.plans
        ]
