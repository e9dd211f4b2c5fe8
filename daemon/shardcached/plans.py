"""The plans the planner reads: each (job, slot)'s chain of plans, its pace, and where urls lie in them.

A chain holds the plans of one (job, slot) ordered by epoch, and the slot's observed open interval (a
moving average). A plan is the ordered urls of one epoch with a cursor. The position index maps
url -> plan id -> the url's position in that plan, or its ascending positions when it repeats there (a bare
int for the common case keeps memory and garbage-collector work down for 100k-url plans). Pure data and
arithmetic: the planner (planner.py) decides what to do with them.

A plan enters and leaves the index in ranges of positions (`index_range` / `unindex_range`, the only two
functions that write the index), so the daemon can spread a million-url plan over many short steps of its
event loop: `Plan.indexed` says how far the plan is indexed. The index is split over `PARTS` dicts by the
url's hash (`Positions`) so that no insertion rehashes a million entries at once, and a dropped plan's url
list shrinks as it is unindexed, so that no step frees a million strings at once.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

# Weight of the newest inter-open interval in the moving average: smooths a slot that stalls once on a
# miss, yet follows a real change of speed within a few opens.
_ALPHA = 0.25
# Two opens in the same clock tick must not make every position of a chain tie at one instant.
_MIN_INTERVAL = 1e-6

PARTS = 256  # dicts the position index is split over: a power of two (a url's part is its hash's low bits)

Where = int | list[int]  # a url's position in one plan, or its ascending positions when it repeats there
PerPlan = dict[str, Where]  # plan id -> where


class _Part(dict[str, PerPlan]):
    """One part of the position index: a dict the garbage collector tracks from its creation.

    A plain dict is tracked only once it holds a container, so an empty part made before `gc.freeze`
    (indexing.py) would be tracked after it, outside the permanent generation, and every full collection
    would walk its entries (~370 ns each here: a part's entries lie all over memory). Tracked from birth,
    the parts are frozen with everything else made at start-up.
    """

    __slots__ = ()


class Positions:
    """The position index, url -> plan id -> position(s), as a dict of urls split over `PARTS` dicts.

    One dict of a million urls rehashes all of them in one C call when it grows past a power of two (50 ms
    here at 700k entries, the event loop and every thread stopped meanwhile); a part grows in steps of
    1/`PARTS` of that. Only the dict operations the planner uses: `get`, item assignment and deletion,
    `len`, `in`, and `part` (a url's own dict, for loops that touch it several times).
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[dict[str, PerPlan]] = [_Part() for _ in range(PARTS)]

    def part(self, url: str) -> dict[str, PerPlan]:
        """The dict that holds `url` (if anything does)."""
        return self._parts[hash(url) & (PARTS - 1)]

    @overload
    def get(self, url: str) -> PerPlan | None: ...

    @overload
    def get(self, url: str, default: PerPlan) -> PerPlan: ...

    def get(self, url: str, default: PerPlan | None = None) -> PerPlan | None:
        return self._parts[hash(url) & (PARTS - 1)].get(url, default)  # dict.get, not overridden

    def __setitem__(self, url: str, per_plan: PerPlan) -> None:
        self._parts[hash(url) & (PARTS - 1)][url] = per_plan

    def __delitem__(self, url: str) -> None:
        del self._parts[hash(url) & (PARTS - 1)][url]

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and url in self._parts[hash(url) & (PARTS - 1)]

    def __len__(self) -> int:
        return sum(map(len, self._parts))


@dataclass(eq=False)
class Chain:
    """The plans of one (job, slot), ordered by epoch, with the slot's observed pace."""

    job: str
    slot: int
    plans: list[Plan] = field(default_factory=list)
    last_open: float | None = None
    last_activity: float = 0.0
    interval: float | None = None  # smoothed seconds between two opens of this slot

    def note_open(self, now: float) -> bool:
        """Count an open of this slot at clock time `now`; whether its interval estimate changed."""
        changed = self.last_open is not None
        if self.last_open is not None:
            observed = max(now - self.last_open, _MIN_INTERVAL)
            previous = self.interval
            self.interval = observed if previous is None else previous + _ALPHA * (observed - previous)
        self.last_open = now
        self.last_activity = now
        return changed


@dataclass(eq=False)
class Plan:
    """The ordered urls one slot opens in one epoch, and how far it got (`cursor`: the next position)."""

    id: str
    chain: Chain
    epoch: int
    urls: list[str]
    cursor: int = 0
    indexed: int = 0  # positions [0, indexed) are in the position index
    digest: str | None = None  # a hash of `urls`, when the registration computed one (off the loop)

    @property
    def remaining(self) -> int:
        return len(self.urls) - self.cursor

    def opens_before(self) -> int:
        """Opens of the slot until position 0 of this plan would be next: p + this = opens until p."""
        ahead = 1 - self.cursor  # the position at the cursor is the next open
        for earlier in self.chain.plans:
            if earlier is self:
                return ahead
            ahead += earlier.remaining
        return ahead

    def time_line(self, now: float, ref: float) -> tuple[float, float]:
        """(a, b) such that position p >= cursor is expected at clock time a + p * b.

        `ref` stands in for the slot's interval until it has one (the median of the other slots').
        """
        chain = self.chain
        interval = ref if chain.interval is None else chain.interval
        base = now if chain.last_open is None else chain.last_open
        return base + self.opens_before() * interval, interval


def index_range(
    positions: Positions, plan: Plan, start: int, stop: int, indexed: Callable[[str], None] | None = None
) -> None:
    """Add positions [start, stop) of `plan` to the position index, in order (ascending positions per url);
    `indexed(url)` after each url's position is in.

    With `unindex_range`, the one place urls enter or leave the index: per-url bookkeeping hooks here.
    """
    pid = plan.id
    urls = plan.urls
    part = positions.part
    for position in range(start, stop):
        url = urls[position]
        owner = part(url)
        per_plan = owner.get(url)
        if per_plan is None:
            owner[url] = {pid: position}
        else:
            where = per_plan.get(pid)
            if where is None:
                per_plan[pid] = position
            elif isinstance(where, int):
                per_plan[pid] = [where, position]
            else:
                where.append(position)
        if indexed is not None:
            indexed(url)


def unindex_range(
    positions: Positions, plan: Plan, start: int, stop: int, unindexed: Callable[[str], None] | None = None
) -> None:
    """Remove the urls at positions [start, stop) of a plan that is no longer live from the index;
    `unindexed(url)` once each url's entries are out.

    All of a url's positions in the plan go at once (the plan is dead: its entries are only garbage).
    """
    pid = plan.id
    urls = plan.urls
    part = positions.part
    for position in range(start, stop):
        url = urls[position]
        owner = part(url)
        per_plan = owner.get(url)
        if per_plan is not None and per_plan.pop(pid, None) is not None:
            if not per_plan:
                del owner[url]
            if unindexed is not None:
                unindexed(url)


def index_plan(positions: Positions, plan: Plan, indexed: Callable[[str], None] | None = None) -> None:
    """Add the rest of `plan`'s urls to the position index."""
    index_range(positions, plan, plan.indexed, len(plan.urls), indexed)
    plan.indexed = len(plan.urls)


def unindex_plan(positions: Positions, plan: Plan, unindexed: Callable[[str], None] | None = None) -> None:
    """Remove `plan`'s indexed urls from the position index."""
    unindex_range(positions, plan, 0, plan.indexed, unindexed)
    plan.indexed = 0


def first_at_or_after(where: Where | None, cursor: int) -> int | None:
    """The first of a url's positions in a plan that is not behind the cursor."""
    if where is None:
        return None
    if isinstance(where, int):
        return where if where >= cursor else None
    i = bisect_left(where, cursor)
    return where[i] if i < len(where) else None
