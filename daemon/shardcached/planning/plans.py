"""The plans the planner reads: each (job, slot)'s chain of plans, its pace, and each plan's url ids.

A chain holds the plans of one (job, slot) ordered by epoch, and the slot's observed open interval (a
moving average). A plan is the ordered url ids (urltable.py) of one epoch with a cursor, as two arrays made
off the event loop (`PlanArrays.of`): `ids`, the id at each position, and `pairs`, every (id, position) as
``id << 32 | position`` sorted, so "the first position of id u at or after the cursor" is one binary search,
repeated urls (padding, resampling, mixes) included. A plan of a million urls is 12 MB in two objects the
garbage collector never walks. Pure data and arithmetic: the planner (planner.py) decides with them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
import numpy.typing as npt

from shardcached.planning.urltable import UrlTable

# Weight of the newest inter-open interval in the moving average: smooths a slot that stalls once on a
# miss, yet follows a real change of speed within a few opens.
_ALPHA = 0.25
# Two opens in the same clock tick must not make every position of a chain tie at one instant.
_MIN_INTERVAL = 1e-6


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


_LOW = (1 << 32) - 1  # the position part of a pair


@dataclass(frozen=True, eq=False)
class PlanArrays:
    """A plan's url ids by position, and its (id, position) pairs sorted (see the module)."""

    ids: npt.NDArray[np.int32]
    pairs: npt.NDArray[np.int64]

    @classmethod
    def of(cls, ids: npt.NDArray[np.int32]) -> PlanArrays:
        """The arrays of a plan reading `ids` in order (blocking for a long plan: O(n log n) in numpy)."""
        pairs = (ids.astype(np.int64) << 32) | np.arange(len(ids), dtype=np.int64)
        pairs.sort()
        return cls(ids, pairs)

    @classmethod
    def from_urls(cls, table: UrlTable, urls: Sequence[str]) -> PlanArrays:
        return cls.of(table.ids(urls))


class PlanUrls(Sequence[str]):
    """A plan's urls by position, read from the table (no list of strings is kept)."""

    __slots__ = ("_ids", "_table")

    def __init__(self, ids: npt.NDArray[np.int32], table: UrlTable) -> None:
        self._ids = ids
        self._table = table

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return self._table.urls(self._ids[index])
        return self._table.url(int(self._ids[index]))

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.urls(self._ids))


@dataclass(eq=False)
class Plan:
    """The ordered url ids one slot opens in one epoch, and how far it got (`cursor`: the next position).

    `slot` is the plan's bit in the index of which plans hold a url (planindex.py) while it is live.
    """

    id: str
    chain: Chain
    epoch: int
    arrays: PlanArrays
    urls: PlanUrls
    cursor: int = 0
    indexed: int = 0  # positions [0, indexed) are in the index of which plans hold a url
    digest: str | None = None  # a hash of the urls, when the registration computed one (off the loop)
    slot: int = -1

    @property
    def ids(self) -> npt.NDArray[np.int32]:
        return self.arrays.ids

    def __len__(self) -> int:
        return len(self.arrays.ids)

    @property
    def remaining(self) -> int:
        return len(self.arrays.ids) - self.cursor

    def first_at_or_after(self, uid: int, position: int) -> int | None:
        """The first position of url id `uid` in this plan that is not before `position`."""
        pairs = self.arrays.pairs
        k = int(pairs.searchsorted((uid << 32) | position))
        if k < len(pairs):
            found = int(pairs[k])
            if found >> 32 == uid:
                return found & _LOW
        return None

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
