"""Plans, next use, prefetch order and eviction choice: Belady's MIN over the union of the clients' plans.

The plans of one (job, slot) form a *chain* ordered by epoch: the remaining positions of the current epoch
come before the next epoch's, so next use is known past the epoch boundary. Each plan has a cursor (moved by
opens carrying its id) and each chain an observed open interval (a moving average; the median of the others
until it has one), so a planned position becomes an estimated time, and slots at different speeds compare:

    time(position) = last open of the chain + opens ahead * chain interval

Pure logic for the daemon's event loop: no I/O, no asyncio, an injected clock. Urls have integer ids
(urltable.py) and plans are arrays of them (plans.py); ``record_open`` is O(log n) (one binary search, and
refiling the resident shards the cursor passed); ``next_use`` looks only at the plans holding the url
(planindex.py, `PlanIndex`, the one answer to "where is this shard used next, by whom"). This module
decides with them.

Eviction: the store tells the planner which shards are resident (``resident``, ``gone``), and the planner
keeps them ordered by next use under one owner plan each and, for those in no plan, by recency (nextuse.py),
updated where a plan indexes a url or is dropped, where a cursor moves, and where a url is touched. So
``choose_resident_victim`` decides in O(C + log R) (C plans, R resident shards) what ``choose_victim``, the
linear reference kept for lists of candidates, decides in O(R x plans per url), with the same result.

Which plans are registered, their chains, expiry and pace are kept by registration.py (`PlanRegistry`,
which tells the next-use index of every chunk of urls indexed and every plan dropped); the registration
methods here delegate to it, so the daemon and the tests keep one object to talk to.

Example:
    >>> t = [0.0]
    >>> p = Planner(clock=lambda: t[0])
    >>> pid = p.add_plan("job", 0, 0, ["a", "b", "c"])
    >>> p.record_open("a", pid)
    >>> p.choose_victim(["a", "c"], incoming=None)  # "a" is in no plan ahead of the cursor any more
    'a'
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence

from shardcached.planning.nextuse import NextUseIndex
from shardcached.planning.planindex import Line, PlanIndex
from shardcached.planning.plans import Plan, PlanArrays
from shardcached.planning.policies import Recency, Window, farthest_next_use, least_recent, nearest_first
from shardcached.planning.registration import PlanRegistry
from shardcached.planning.urltable import UrlTable

logger = logging.getLogger(__name__)

POLICIES = ("belady", "lru")


class Planner:
    """Tracks plans and recency; answers next use, prefetch candidates and eviction victims.

    Args:
        policy: ``"belady"`` (farthest next use over all plans) or ``"lru"`` (plain recency, no prefetch).
        prefetch_depth: how many positions ahead of each (job, slot)'s cursor may be prefetched.
        stale_after_s: a (job, slot) with no open and no new plan for this long loses its plans.
        clock: monotonic seconds; injected so that tests drive time.
        displace_ahead: a prefetch may evict a resident shard only for a shard at most this many opens ahead
            of its slot's cursor; farther prefetches fill free space only. Evicting early decides with less
            knowledge than a later demand miss would have (the plans of the epoch after next arrive when the
            next one starts), which cost 2-6% extra fetches over MIN in the 4-of-16-slots benchmark.
    """

    def __init__(
        self,
        policy: str = "belady",
        prefetch_depth: int = 2,
        stale_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        displace_ahead: int = 1,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}: use one of {', '.join(POLICIES)}")
        if prefetch_depth < 0:
            raise ValueError(f"prefetch_depth must be >= 0, got {prefetch_depth}")
        if stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        self.policy = policy
        self.prefetch_depth = prefetch_depth
        self.displace_ahead = displace_ahead
        self.stale_after_s = stale_after_s
        self._clock = clock
        self.table = UrlTable()
        self._recency = Recency(self.table)
        self._uses = PlanIndex()
        # The resident shards (told by the store: `resident`, `gone`), ordered by next use and by recency.
        self._index = NextUseIndex(
            self.table,
            self._uses,
            self._recency.rank_of,
            self._recency.ranks_of,
            self._line_now,
            by_recency_only=policy == "lru",
        )
        self._registry = PlanRegistry(stale_after_s, clock, self.table, self._uses, self._index)

    # -- registration: registration.py keeps the plans; these delegate --------------------------------
    def add_plan(self, job: str, slot: int, epoch: int, urls: Sequence[str]) -> str:
        """Register the ordered urls one slot of one job will open in one epoch; returns the plan id.

        Registering the same (job, slot, epoch) again with the same urls returns the existing id and keeps
        its cursor (a client re-registers after reconnecting); with other urls it replaces the plan.
        The whole plan is indexed before this returns (the daemon uses `begin_plan` and `index_more`).
        """
        plan_id = self._registry.add_plan(job, slot, epoch, urls)
        self._index.settle()  # a replaced plan's resident shards too
        return plan_id

    def arrays(self, urls: Sequence[str]) -> PlanArrays:
        """A plan's arrays for `urls` (thread-safe and blocking: a worker thread makes a long plan's)."""
        return PlanArrays.from_urls(self.table, urls)

    def begin_plan(
        self,
        job: str,
        slot: int,
        epoch: int,
        urls: Sequence[str] | PlanArrays,
        digest: str | None = None,
    ) -> tuple[Plan, bool]:
        """See `PlanRegistry.begin_plan`: registered now, (plan, whether it still needs `index_more`)."""
        arrays = urls if isinstance(urls, PlanArrays) else self.arrays(urls)
        return self._registry.begin_plan(job, slot, epoch, arrays, digest)

    def index_more(self, plan: Plan, budget: int) -> bool:
        """See `PlanRegistry.index_more`: up to `budget` more urls indexed; True once none is left."""
        return self._registry.index_more(plan, budget)

    def delete_plan(self, plan_id: str) -> bool:
        """Forget a plan and remove it from the index; False if the id is unknown (never registered,
        deleted, or dropped as stale)."""
        deleted = self._registry.delete_plan(plan_id)
        self._index.settle()
        return deleted

    def drop_plan(self, plan_id: str) -> bool:
        """Forget a plan now and leave its index entries to `unindex_more` and the refiling of its resident
        shards to `refile_more` (or the next decision); False if the id is unknown. O(1) in its length."""
        return self._registry.drop_plan(plan_id)

    def unindex_more(self, budget: float) -> bool:
        """Clear up to `budget` positions of dropped plans from the index; True once none is left."""
        return self._registry.unindex_more(budget)

    @property
    def unindex_pending(self) -> bool:
        """Whether dropped plans still have positions in the index (see `unindex_more`)."""
        return self._registry.unindex_pending

    def refile_more(self, budget: int) -> bool:
        """Refile up to `budget` resident shards of dropped plans by their next use (nextuse.py); True once
        none is left. Decisions settle what is left first, so this only keeps them cheap."""
        return self._index.refile_more(budget)

    @property
    def refile_pending(self) -> bool:
        """Whether dropped plans still have resident shards to refile (see `refile_more`)."""
        return self._index.refile_pending

    def orphan(self, plan_id: str, grace_s: float) -> bool:
        """The process that registered `plan_id` exited: drop its (job, slot)'s plans after `grace_s`
        unless an open or a new registration shows the slot is read on; False for an unknown id."""
        return self._registry.orphan(plan_id, grace_s)

    def ending(self, plan_id: str, within_s: float) -> bool:
        """Whether `plan_id` is gone or will be dropped within `within_s` unless its slot shows activity
        (its holder exited, or it has been idle for nearly `stale_after_s`)."""
        return self._registry.ending(plan_id, within_s)

    def expire_stale(self) -> int:
        """Drop the plans of every (job, slot) idle for `stale_after_s` and remove them from the index;
        returns how many plans went."""
        dropped = self._registry.expire_stale()
        self._index.settle()
        return dropped

    def expire_due(self) -> None:
        """Drop the plans of the slots stale by now, as the next decision would (amortised O(1)), so that a
        caller can await their refile (indexing.refiled) before it decides."""
        self._registry.maybe_expire(self._clock())

    def retire_stale(self) -> int:
        """Drop the plans of every (job, slot) idle for `stale_after_s`, leaving their index entries to
        `unindex_more`: O(plans), whatever their length. Returns how many plans went."""
        return self._registry.retire_stale()

    def describe(self) -> list[dict[str, object]]:
        """The live plans, for debugging: id, job, slot, epoch, cursor, len, interval_s, last_open."""
        return self._registry.describe()

    def plan(self, plan_id: str) -> Plan | None:
        """The live plan `plan_id` (its cursor, urls and chain), or None for an unknown id."""
        return self._registry.plan(plan_id)

    def job_of(self, plan_id: str) -> str | None:
        """The job of a live plan; None for an unknown id."""
        plan = self._registry.plan(plan_id)
        return None if plan is None else plan.chain.job

    def has_plan(self, plan_id: str) -> bool:
        """Whether `plan_id` is a live plan."""
        return self._registry.plan(plan_id) is not None

    @property
    def plan_count(self) -> int:
        """Number of live plans."""
        return self._registry.plan_count

    @property
    def reader_count(self) -> int:
        """Number of (job, slot) pairs with a live plan: the readers that may read concurrently."""
        return len(self._registry.readers())

    # -- opens, residency and decisions -----------------------------------------------------------------
    def record_open(self, url: str, plan_id: str | None = None) -> None:
        """Note a client open (hit or miss) of `url`, optionally made under a plan.

        With a known plan id the plan's cursor moves past the first occurrence of `url` at or after it
        (skipped positions are passed over; a repeated open of an already passed url leaves it in place),
        earlier epochs of the same (job, slot) count as finished, and the slot's pace is updated.
        """
        uid = self._recency.touch(url)
        self._index.touched(uid)
        if plan_id is None:
            return
        plan = self._registry.plan(plan_id)
        if plan is None:
            return
        chain = plan.chain
        if chain.note_open(self._clock()):
            self._registry.pace_changed()
        for earlier in chain.plans:
            if earlier is plan:
                break
            start, earlier.cursor = earlier.cursor, len(earlier)
            self._index.passed(earlier, start, earlier.cursor)
        position = plan.first_at_or_after(uid, plan.cursor)
        if position is not None:
            start, plan.cursor = plan.cursor, position + 1
            self._index.passed(plan, start, plan.cursor)

    def touch(self, url: str) -> None:
        """Mark `url` as just used for recency, without any plan (e.g. a shard that was just fetched)."""
        self._index.touched(self._recency.touch(url))

    def forget(self, url: str) -> None:
        """The shard left the cache: drop its recency."""
        self._recency.forget(url)
        uid = self.table.find(url)
        if uid is not None:
            self._index.touched(uid)

    def resident(self, url: str) -> None:
        """`url` became resident (the store calls this; last in its order, which breaks ties)."""
        self._index.add(self.table.id(url))

    def gone(self, url: str) -> None:
        """`url` left the cache (the store calls this)."""
        uid = self.table.find(url)
        if uid is not None:
            self._index.remove(uid)

    def next_use(self, url: str) -> float | None:
        """Distance to the nearest planned use of `url` ahead of any cursor, in opens at the median pace.

        None when no live plan has `url` ahead of its cursor. An overdue use (its slot is slower than
        estimated) reads 0.
        """
        now = self._clock()
        self._registry.maybe_expire(now)
        ref = self._registry.reference_interval()
        when = self._next_time(self.table.find(url), now, ref, {})
        if when is None:
            return None
        return max(0.0, (when - now) / ref)

    def next_use_at(self, url: str) -> float | None:
        """Estimated clock time of the nearest planned use of `url` (may lie in the past when overdue).

        Unlike `next_use` this is never clamped, so it orders any two shards exactly as eviction does.
        """
        now = self._clock()
        self._registry.maybe_expire(now)
        return self._next_time(self.table.find(url), now, self._registry.reference_interval(), {})

    def choose_victim(self, candidates: Iterable[str], incoming: str | None = None) -> str | None:
        """Which of `candidates` (resident, evictable shards) to evict to make room for `incoming`.

        Linear in the candidates (the reference the ordered `choose_resident_victim` must agree with, and the
        entry point for callers that hold their own list, such as the cluster simulation).

        lru: the least recently opened. belady: shards in no plan first (least recent first), then the
        farthest next use. For a prefetch (`incoming` given) returns None when every candidate is needed
        no later than `incoming`, or when `incoming` is more than `displace_ahead` opens ahead of its slot:
        the prefetch must wait. For a demand open pass ``incoming=None``; the answer is then never None
        while `candidates` is non-empty.
        """
        pool = list(candidates)
        if not pool:
            return None
        if self.policy == "lru":
            return least_recent(pool, self._recency)
        now = self._clock()
        self._registry.maybe_expire(now)
        ref = self._registry.reference_interval()
        lines: dict[int, Line] = {}
        incoming_time = None
        if incoming is not None:
            if self._opens_ahead(incoming) > self.displace_ahead:
                return None  # too early to displace anything (or in no plan at all): fill free space only
            incoming_time = self._next_time(self.table.find(incoming), now, ref, lines)
        find = self.table.find
        return farthest_next_use(
            pool, lambda url: self._next_time(find(url), now, ref, lines), self._recency, incoming_time
        )

    def choose_resident_victim(
        self, usable: Callable[[str], bool], incoming: str | None = None
    ) -> str | None:
        """`choose_victim` over the resident shards that `usable` accepts (in the store's order), without
        a list of them: the same choice in O(C + log R) for C readers and R resident shards (nextuse.py).

        `usable(url)` says whether a resident shard may go now (no lease holds it, no open awaits it); it
        is asked only of the shards the walk meets. None also when no resident shard is usable.
        """
        index = self._index
        if self.policy == "lru":
            return index.least_recent_idle(usable)
        now = self._clock()
        self._registry.maybe_expire(now)
        ref = self._registry.reference_interval()
        lines: dict[int, Line] = {}
        incoming_time = None
        if incoming is not None:
            if self._opens_ahead(incoming) > self.displace_ahead:
                return None  # as in choose_victim
            incoming_time = self._next_time(self.table.find(incoming), now, ref, lines)
        idle = index.least_recent_idle(usable)
        if idle is not None:
            return idle

        def line(plan: Plan) -> Line:
            known = lines.get(plan.slot)
            if known is None:
                known = lines[plan.slot] = plan.time_line(now, ref)
            return known

        found = index.farthest(usable, line, lambda uid: self._next_time(uid, now, ref, lines))
        if found is None or (incoming_time is not None and found[1] <= incoming_time):
            return None
        return found[0]

    def has_resident(self, usable: Callable[[str], bool]) -> bool:
        """Whether any resident shard is accepted by `usable` (the store's shards told by `resident`)."""
        return self._index.any_usable(usable)

    def prefetch_candidates(self, skip: Callable[[str], bool], limit: int) -> list[str]:
        """Up to `limit` urls to fetch ahead, nearest next use first.

        Each lies at most `prefetch_depth` positions ahead of its (job, slot)'s cursor (the walk continues
        into the next epoch's plan). `skip(url)` is True for urls that are resident or being fetched.
        Always empty under ``lru``: the baseline has no prefetch.
        """
        if self.policy == "lru" or limit <= 0 or self.prefetch_depth == 0:
            return []
        now = self._clock()
        self._registry.maybe_expire(now)
        ref = self._registry.reference_interval()
        windows = []
        for chain in self._registry.readers():
            budget = self.prefetch_depth
            for plan in chain.plans:
                end = min(len(plan), plan.cursor + budget)
                if end > plan.cursor:
                    windows.append(Window(plan.urls, plan.cursor, end, *plan.time_line(now, ref)))
                    budget -= end - plan.cursor
                if budget <= 0:
                    break
        return nearest_first(windows, skip, limit)

    def _line_now(self, plan: Plan) -> Line:
        """`plan`'s time line now (which owner a url is filed under; any choice is correct)."""
        return plan.time_line(self._clock(), self._registry.reference_interval())

    def _opens_ahead(self, url: str) -> float:
        """How many opens of its slot until the nearest planned use of `url` (inf when in no plan)."""
        uid = self.table.find(url)
        if uid is None:
            return math.inf
        return min(
            (plan.opens_before() + position for plan, position in self._uses.uses(uid)), default=math.inf
        )

    def _next_time(self, uid: int | None, now: float, ref: float, lines: dict[int, Line]) -> float | None:
        """Estimated clock time of the nearest planned use of url id `uid` ahead of any cursor.

        `lines` memoises each plan's time line (by slot) within one call (cursors do not move during a
        call), so ranking many candidates computes each plan's line once.
        """
        if uid is None:
            return None
        best: float | None = None
        for plan, position in self._uses.uses(uid):
            line = lines.get(plan.slot)
            if line is None:
                line = lines[plan.slot] = plan.time_line(now, ref)
            when = line[0] + position * line[1]
            if best is None or when < best:
                best = when
        return best
