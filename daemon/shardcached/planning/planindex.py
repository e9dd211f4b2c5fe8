"""Where is a shard used next, and by whom: which live plans hold each url id, and its first use in each.

Each live plan has a *slot*, a bit number; a matrix of uint64 words by url id holds, per url, the bits of
the plans that hold it (8 bytes a url while at most 64 plans live; a word more per 64 plans). A url's uses
are then its bits, and in each plan one binary search over the plan's sorted pairs (plans.py): O(plans
holding the url * log n), with no per-url Python object. Bulk questions (`earliest` over many urls: a
dropped plan's shards, a newly indexed chunk) run per plan as numpy calls over the urls that plan holds.

A plan enters in bounded pieces (`index_more`, its bits set chunk by chunk; its `indexed` says how far),
and leaves at once (`drop`: its bit stops counting, O(1)); its bits are cleared later in pieces
(`clean_more`) before its slot is given to another plan. Pure bookkeeping, no I/O; event loop thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from shardcached.planning.orders import distinct
from shardcached.planning.plans import Plan

_LOW = (1 << 32) - 1
Line = tuple[float, float]  # a plan's time line: position p is expected at a + p * b


class PlanIndex:
    """The live plans by slot and, per url id, the slots of the plans holding it."""

    def __init__(self) -> None:
        self._holders = np.zeros((1024, 1), dtype=np.uint64)
        self._plans: list[Plan | None] = []  # slot -> its live plan (None: free, or dropped and not clean)
        self._live: list[int] = [0]  # the live slots' bits, one Python int per word of `_holders`
        self._free: list[int] = []
        self._dead: deque[Plan] = deque()  # dropped plans whose bits are not all cleared yet

    # -- plans entering and leaving ---------------------------------------------------------------------
    def add(self, plan: Plan) -> None:
        """`plan` is live from now on (none of its positions indexed yet)."""
        if self._free:
            slot = min(self._free)  # the lowest: ties between plans go to the lowest slot
            self._free.remove(slot)
        else:
            slot = len(self._plans)
            self._plans.append(None)
            if slot >= 64 * self._holders.shape[1]:
                grown = np.zeros((self._holders.shape[0], self._holders.shape[1] + 1), dtype=np.uint64)
                grown[:, :-1] = self._holders
                self._holders = grown
                self._live.append(0)
        plan.slot, plan.indexed = slot, 0
        self._plans[slot] = plan
        self._live[slot >> 6] |= 1 << (slot & 63)

    def index_more(self, plan: Plan, budget: int) -> npt.NDArray[np.int64]:
        """Count up to `budget` more positions of live `plan` as holding their urls; the (distinct) ids
        indexed now."""
        stop = min(len(plan), plan.indexed + budget)
        ids = distinct(plan.ids[plan.indexed : stop])
        plan.indexed = stop
        if len(ids):
            self._reserve(int(ids[-1]))
            word, bit = divmod(plan.slot, 64)
            self._holders[ids, word] |= np.uint64(1 << bit)
        return ids

    def drop(self, plan: Plan) -> None:
        """`plan` holds nothing from now on (O(1)); `clean_more` clears its bits later."""
        slot = plan.slot
        self._live[slot >> 6] &= ~(1 << (slot & 63))
        self._plans[slot] = None
        self._dead.append(plan)

    @property
    def clean_pending(self) -> bool:
        return bool(self._dead)

    def clean_more(self, budget: int) -> bool:
        """Clear up to `budget` positions' bits of dropped plans; True once none is left."""
        while self._dead and budget > 0:
            plan = self._dead[0]
            start = max(0, plan.indexed - budget)
            ids = plan.ids[start : plan.indexed]
            budget -= len(ids)
            word, bit = divmod(plan.slot, 64)
            self._holders[ids, word] &= ~np.uint64(1 << bit)
            plan.indexed = start
            if start == 0:
                self._dead.popleft()
                self._free.append(plan.slot)
                plan.slot = -1
        return not self._dead

    # -- questions --------------------------------------------------------------------------------------
    def plans(self) -> Iterator[Plan]:
        """The live plans, by slot."""
        return (plan for plan in self._plans if plan is not None)

    def holding(self, uid: int) -> Iterator[Plan]:
        """The live plans that hold url id `uid` (indexed positions), by slot."""
        if uid >= self._holders.shape[0]:
            return
        row = self._holders[uid]
        for word, live in enumerate(self._live):
            bits = int(row[word]) & live
            while bits:
                low = bits & -bits
                bits ^= low
                plan = self._plans[(word << 6) + low.bit_length() - 1]
                if plan is not None:
                    yield plan

    def uses(self, uid: int) -> Iterator[tuple[Plan, int]]:
        """(plan, position) of the first use of `uid` at or after each live plan's cursor that has one."""
        for plan in self.holding(uid):
            position = plan.first_at_or_after(uid, plan.cursor)
            if position is not None:
                yield plan, position

    def first_use(self, uid: int, line: Callable[[Plan], Line]) -> tuple[Plan, int, float] | None:
        """The use of `uid` earliest by `line` (the lowest slot on ties): (plan, position, time)."""
        best: tuple[Plan, int, float] | None = None
        for plan, position in self.uses(uid):
            a, b = line(plan)
            when = a + position * b
            if best is None or when < best[2]:
                best = (plan, position, when)
        return best

    def earliest(
        self, uids: npt.NDArray[np.int64], line: Callable[[Plan], Line]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """`first_use` of many url ids at once: (slot, position) of each, slot -1 where none."""
        count = len(uids)
        slots = np.full(count, -1, dtype=np.int64)
        positions = np.zeros(count, dtype=np.int64)
        times = np.full(count, np.inf)
        inside = uids < self._holders.shape[0]
        rows = self._holders[np.where(inside, uids, 0)]
        rows[~inside] = 0
        for plan in self.plans():
            word, bit = divmod(plan.slot, 64)
            where = np.flatnonzero(rows[:, word] & np.uint64(1 << bit))
            if not len(where):
                continue
            held = uids[where]
            pairs = plan.arrays.pairs
            k = pairs.searchsorted((held << 32) | plan.cursor)
            found = pairs[np.minimum(k, len(pairs) - 1)]
            ok = (k < len(pairs)) & ((found >> 32) == held)
            a, b = line(plan)
            when = a + (found & _LOW) * b
            better = ok & (when < times[where])
            chosen = where[better]
            times[chosen] = when[better]
            slots[chosen] = plan.slot
            positions[chosen] = (found & _LOW)[better]
        return slots, positions

    def plan_at(self, slot: int) -> Plan | None:
        """The live plan of `slot`, or None."""
        return self._plans[slot] if 0 <= slot < len(self._plans) else None

    def _reserve(self, uid: int) -> None:
        rows = self._holders.shape[0]
        if uid >= rows:
            grown = np.zeros((max(2 * rows, uid + 1), self._holders.shape[1]), dtype=np.uint64)
            grown[:rows] = self._holders
            self._holders = grown
