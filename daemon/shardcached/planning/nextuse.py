"""The resident shards' next uses, kept ordered so that one eviction decision costs O(C + log R), not O(R).

R is the number of resident shards, C the number of live plans. A url's estimated next-use time is the
minimum over the plans holding it of that plan's time line at the url's first position at or after its
cursor; every time line moves on every open of its slot, so no single global order by time stays valid.
Two orders do:

* Each planned resident url is filed once, under an *owner*: the plan whose use of it was the earliest in
  time when it was filed, at that position. Within one plan, time grows with position, so a plan's owned
  positions (`orders.PositionSet`) are in time order whatever the paces do later. An owned entry is one of
  the url's uses, so its time is never earlier than the url's exact next use: an upper bound, however
  stale the owner has become since (paces change, other plans arrive).
* Resident urls that no plan holds ahead of a cursor ("idle") rank by recency alone, which changes only when
  the url is touched: they are kept by (recency rank, store order) in an `orders.MinOrder` by url id.

The farthest-next-use victim is found by a threshold walk over the owned orders (Fagin's TA, each url met
at most once): walk them from their far ends, always the one whose next entry is latest, evaluate each url
met exactly, and stop once the best exact time is later than every order's next entry (no url not met yet
can be later). Ties go to the earliest in store order, as the linear scan does. A url met whose exact time
is earlier than its owned entry's has a stale owner: it is refiled after the walk, so it is met once.

What moves a url's filing: it becomes resident or leaves; a cursor passes its owned position (`passed`:
the owned positions below the new cursor are exactly the ones to refile, no other url's upper bound
changes); a plan indexing it (`indexed`: it may have become planned, or have an earlier use); its owner
plan dropped (`dropped`, O(1) on the request path: the plan's owned urls are queued and refiled by
`refile_more` in vectorised pieces, and every decision settles what is left first, so decisions see the
eager state); a touch of an idle url. Per url the state is a few array cells by url id (urltable.py): no
Python object per url, nothing for the garbage collector to walk.

Pure bookkeeping for the planner (planner.py); the event loop thread only.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shardcached.planning.orders import MinOrder, PositionSet, distinct
from shardcached.planning.planindex import Line, PlanIndex
from shardcached.planning.plans import Plan
from shardcached.planning.urltable import UrlTable

UNRANKED = 1 << 62  # idle key of a url never used: its store order, below every used url's rank


class NextUseIndex:
    """Resident urls: the planned ones filed under their owner plan, the idle ones by recency.

    Args:
        table: the urls' ids.
        plans: the live plans and which hold each url.
        rank: the recency rank of a url id (larger is more recent; 0 never used).
        ranks: `rank` of many url ids at once.
        line: a plan's time line now, which picks a url's owner when it is filed (any choice is correct;
            the earliest keeps the walk short).
        by_recency_only: keep every resident url in the recency order (the lru policy): plans are ignored.
    """

    def __init__(
        self,
        table: UrlTable,
        plans: PlanIndex,
        rank: Callable[[int], int],
        ranks: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]],
        line: Callable[[Plan], Line],
        *,
        by_recency_only: bool = False,
    ) -> None:
        self._table = table
        self._plans = plans
        self._rank = rank
        self._ranks = ranks
        self._line = line
        self._by_recency_only = by_recency_only
        self._next_seq = 0
        self._count = 0
        size = 1024
        self._seq = np.full(size, -1, dtype=np.int64)  # by url id: place in the store's order, -1 absent
        self._owner = np.full(size, -1, dtype=np.int64)  # by url id: owner plan's slot, -1 none
        self._owned_at = np.zeros(size, dtype=np.int64)  # by url id: its position in the owner plan
        self._owned: dict[int, PositionSet] = {}  # slot -> the positions filed under that plan
        self._idle = MinOrder()
        self._pending: deque[npt.NDArray[np.int64]] = deque()  # url ids of dropped owners, to refile

    def __contains__(self, uid: int) -> bool:
        return uid < len(self._seq) and self._seq[uid] >= 0

    def __len__(self) -> int:
        return self._count

    def seq(self, uid: int) -> int:
        """The url's place in the store's order (smaller is older)."""
        return int(self._seq[uid])

    def resident_ids(self) -> npt.NDArray[np.int64]:
        """Every resident url id, in the store's order."""
        ids = np.flatnonzero(self._seq >= 0)
        return ids[np.argsort(self._seq[ids], kind="stable")]

    def idle_key(self, uid: int) -> int | None:
        """The key `uid` is filed under in the idle order, None when it is not idle."""
        return self._idle.key(uid)

    def owned_by(self, uid: int) -> tuple[int, int] | None:
        """(owner slot, position) of a planned resident url, None otherwise."""
        if uid >= len(self._owner) or self._owner[uid] < 0:
            return None
        return int(self._owner[uid]), int(self._owned_at[uid])

    # -- residency --------------------------------------------------------------------------------------
    def add(self, uid: int) -> None:
        """`uid` became resident (last in the store's order)."""
        if uid in self:
            self.remove(uid)
        self._reserve(uid)
        self._seq[uid] = self._next_seq
        self._next_seq += 1
        self._count += 1
        self.refile(uid)

    def remove(self, uid: int) -> None:
        """`uid` left the cache."""
        if uid not in self:
            return
        self._idle.discard(uid)
        self._disown(uid)
        self._seq[uid] = -1
        self._count -= 1

    # -- changes of next use ----------------------------------------------------------------------------
    def touched(self, uid: int) -> None:
        """`uid`'s recency changed: refile it if it is idle."""
        if uid in self._idle:
            self._idle.set(uid, self._idle_key(uid))

    def refile(self, uid: int) -> None:
        """File resident `uid` under its earliest use now, or as idle when no plan has it ahead."""
        if uid not in self:
            return
        found = None if self._by_recency_only else self._plans.first_use(uid, self._line)
        if found is None:
            self._disown(uid)
            self._idle.set(uid, self._idle_key(uid))
            return
        plan, position, _ = found
        slot = plan.slot
        if self._owner[uid] == slot and self._owned_at[uid] == position:
            return
        self._idle.discard(uid)
        self._disown(uid)
        self._owner[uid] = slot
        self._owned_at[uid] = position
        owned = self._owned.get(slot)
        if owned is None:
            owned = self._owned[slot] = PositionSet(len(plan))
        owned.add(position)

    def refile_many(self, uids: npt.NDArray[np.int64]) -> None:
        """`refile` of many url ids at once, vectorised (no repeats in `uids`)."""
        uids = uids[uids < len(self._seq)]
        uids = uids[self._seq[uids] >= 0]
        if not len(uids):
            return
        if self._by_recency_only:
            slots = np.full(len(uids), -1, dtype=np.int64)
            positions = np.zeros(len(uids), dtype=np.int64)
        else:
            slots, positions = self._plans.earliest(uids, self._line)
        same = (self._owner[uids] == slots) & (self._owned_at[uids] == positions) & (slots >= 0)
        uids, slots, positions = uids[~same], slots[~same], positions[~same]
        owners = self._owner[uids]
        for slot in distinct(owners[owners >= 0]).tolist():
            self._owned[slot].remove_many(self._owned_at[uids[owners == slot]])
        self._owner[uids] = slots
        self._owned_at[uids] = positions
        idle = slots < 0
        if idle.any():
            now_idle = uids[idle]
            ranks = self._ranks(now_idle)
            keys = np.where(ranks > 0, ranks, self._seq[now_idle] - UNRANKED)
            self._idle.set_many(now_idle, keys)
        self._idle.discard_many(uids[~idle])
        for slot in distinct(slots[~idle]).tolist():
            owned = self._owned.get(slot)
            if owned is None:
                plan = self._plans.plan_at(slot)
                assert plan is not None
                owned = self._owned[slot] = PositionSet(len(plan))
            owned.add_many(positions[slots == slot])

    def indexed(self, uids: npt.NDArray[np.int64]) -> None:
        """A plan now holds `uids` (distinct): the resident ones may have become planned or nearer."""
        self.refile_many(uids)

    def passed(self, plan: Plan, start: int, stop: int) -> None:
        """`plan`'s cursor moved from `start` to `stop`: the urls filed under it in between move on."""
        owned = self._owned.get(plan.slot)
        if owned is None or not len(owned) or stop <= start:
            return
        positions = owned.between(start, stop)
        if len(positions) == 1:
            self.refile(int(plan.ids[positions[0]]))
        elif len(positions):
            self.refile_many(distinct(plan.ids[positions]))

    def dropped(self, plan: Plan) -> None:
        """`plan` is no longer live: the urls filed under it are to be refiled, by `refile_more` in pieces
        or by `settle` before the next decision. O(its owned positions) in numpy, none per url in Python."""
        owned = self._owned.pop(plan.slot, None)
        if owned is None or not len(owned):
            return
        uids = plan.ids[owned.members()].astype(np.int64)
        self._owner[uids] = -1  # the slot may serve another plan before these are refiled
        self._pending.append(uids)

    @property
    def refile_pending(self) -> bool:
        """Whether dropped plans still have resident urls to refile (see `refile_more`)."""
        return bool(self._pending)

    def refile_more(self, budget: int | None) -> bool:
        """Refile up to `budget` (None: all) urls of dropped owners; True once none is left."""
        while self._pending and (budget is None or budget > 0):
            uids = self._pending[0]
            take = len(uids) if budget is None else min(budget, len(uids))
            self._pending[0] = uids[take:]
            if take == len(uids):
                self._pending.popleft()
            self.refile_many(uids[:take])
            if budget is not None:
                budget -= take
        return not self._pending

    def settle(self) -> None:
        """Refile everything pending now: the orders are then exactly as if every drop had been eager."""
        if self._pending:
            self.refile_more(None)

    # -- decisions --------------------------------------------------------------------------------------
    def least_recent_idle(self, usable: Callable[[str], bool]) -> str | None:
        """The least recent idle url that `usable` accepts (first in store order on ties), or None."""
        self.settle()
        url = self._table.url
        found = self._idle.first(lambda uid: usable(url(uid)))
        return None if found is None else url(found)

    def any_usable(self, usable: Callable[[str], bool]) -> bool:
        """Whether any resident url is accepted by `usable` (walks only past the ones it refuses)."""
        url = self._table.url
        for start in range(0, len(self._seq), 4096):
            for uid in np.flatnonzero(self._seq[start : start + 4096] >= 0).tolist():
                if usable(url(start + uid)):
                    return True
        return False

    def farthest(
        self,
        usable: Callable[[str], bool],
        line: Callable[[Plan], Line],
        next_time: Callable[[int], float | None],
    ) -> tuple[str, float] | None:
        """The planned url that `usable` accepts with the latest `next_time`, first in store order on ties.

        `line(plan)` is the plan's time line for this decision; `next_time(uid)` the exact estimate (the
        min over every plan holding the url), which decides.
        """
        self.settle()  # a dropped plan's urls are filed nowhere until refiled (module docstring)
        heads: list[tuple[float, int, int, Plan, PositionSet, float, float]] = []
        for slot, owned in self._owned.items():
            position = owned.last()
            plan = self._plans.plan_at(slot)
            if position is None or plan is None:
                continue
            a, b = line(plan)
            heads.append((-(a + position * b), slot, position, plan, owned, a, b))
        heapq.heapify(heads)
        table_url, seqs = self._table.url, self._seq
        best = -1
        best_time = -float("inf")
        best_seq = 0
        stale: list[int] = []  # urls met whose owned entry is later than their exact time
        while heads:
            negative, slot, position, plan, owned, a, b = heads[0]
            if -negative < best_time:
                break  # every url not met yet is needed sooner than the best one met
            uid = int(plan.ids[position])
            if usable(table_url(uid)):
                when = next_time(uid)
                seq = int(seqs[uid])
                if when is None or when < -negative:
                    stale.append(uid)
                if when is not None and (when > best_time or (when == best_time and seq < best_seq)):
                    best, best_time, best_seq = uid, when, seq
            following = owned.before(position)
            if following is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (-(a + following * b), slot, following, plan, owned, a, b))
        for uid in stale:  # after the walk: the orders must not change under it
            self.refile(uid)
        return None if best < 0 else (table_url(best), best_time)

    # -- internals --------------------------------------------------------------------------------------
    def _idle_key(self, uid: int) -> int:
        rank = self._rank(uid)
        return rank if rank > 0 else int(self._seq[uid]) - UNRANKED

    def _disown(self, uid: int) -> None:
        slot = int(self._owner[uid])
        if slot >= 0:
            self._owned[slot].remove(int(self._owned_at[uid]))
            self._owner[uid] = -1

    def _reserve(self, uid: int) -> None:
        size = len(self._seq)
        if uid < size:
            return
        grown = max(2 * size, uid + 1)
        self._seq = np.concatenate([self._seq, np.full(grown - size, -1, dtype=np.int64)])
        self._owner = np.concatenate([self._owner, np.full(grown - size, -1, dtype=np.int64)])
        self._owned_at = np.concatenate([self._owned_at, np.zeros(grown - size, dtype=np.int64)])
