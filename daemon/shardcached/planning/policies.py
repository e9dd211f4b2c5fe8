"""Eviction policies: plain recency (the LRU baseline) and Belady's farthest-next-use over planned uses.

The planner supplies the estimates (`next_time`: the clock time a url is next expected to be opened, None
when no plan has it ahead); these functions only rank. Kept apart from the plan bookkeeping so that the rule
the property tests check against offline MIN reads in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shardcached.planning.urltable import UrlTable


class Recency:
    """Order of last use: a counter, not the clock, so two opens in one clock tick still rank.

    Kept by url id (urltable.py) in an array: no Python object per url.
    """

    def __init__(self, table: UrlTable) -> None:
        self._table = table
        self._last = np.zeros(1024, dtype=np.int64)
        self._seq = 0

    def touch(self, url: str) -> int:
        """Mark `url` as just used; its id."""
        uid = self._table.id(url)
        if uid >= len(self._last):
            grown = np.zeros(max(2 * len(self._last), uid + 1), dtype=np.int64)
            grown[: len(self._last)] = self._last
            self._last = grown
        self._seq += 1
        self._last[uid] = self._seq
        return uid

    def forget(self, url: str) -> None:
        uid = self._table.find(url)
        if uid is not None and uid < len(self._last):
            self._last[uid] = 0

    def rank(self, url: str) -> int:
        """Larger is more recent; a url never used (or forgotten) ranks 0, the least recent."""
        uid = self._table.find(url)
        return 0 if uid is None else self.rank_of(uid)

    def rank_of(self, uid: int) -> int:
        """`rank` of a url id."""
        return int(self._last[uid]) if uid < len(self._last) else 0

    def ranks_of(self, uids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """`rank` of many url ids at once."""
        inside = uids < len(self._last)
        return np.where(inside, self._last[np.where(inside, uids, 0)], 0)


def least_recent(pool: Sequence[str], recency: Recency) -> str:
    """The LRU victim of a non-empty pool."""
    return min(pool, key=recency.rank)


def farthest_next_use(
    pool: Sequence[str],
    next_time: Callable[[str], float | None],
    recency: Recency,
    incoming_time: float | None = None,
) -> str | None:
    """Belady's victim of a non-empty pool.

    Shards in no plan go first, least recent first; otherwise the one whose next use is farthest. With
    `incoming_time` (a prefetch expected then) returns None when every candidate is needed no later: evicting
    it would trade a sooner use for a later one.
    """
    unplanned: list[str] = []
    farthest: str | None = None
    farthest_time = -math.inf
    for url in pool:
        when = next_time(url)
        if when is None:
            unplanned.append(url)
        elif farthest is None or when > farthest_time:
            farthest, farthest_time = url, when
    if unplanned:
        return least_recent(unplanned, recency)
    if incoming_time is not None and farthest_time <= incoming_time:
        return None
    return farthest


def prefetch_victim(
    choose: Callable[[str | None], str | None],
    next_use_at: Callable[[str], float | None],
    url: str,
    *,
    warm: bool,
) -> str | None:
    """What a prefetch (or warm) of `url` may evict: a shard needed later than `url`, or None to wait.

    `choose(incoming)` is the planner's victim for `incoming` (None: a demand open) among the candidates.
    Warming may also take a shard that no plan needs (least recent first), never a planned one: it used to
    evict as a demand open does, so warming unplanned URLs pushed out shards the trainers were about to read.
    """
    victim = choose(url)
    if victim is None and warm:
        fallback = choose(None)
        if fallback is not None and next_use_at(fallback) is None:
            return fallback
    return victim


class Window(NamedTuple):
    """Positions start..end-1 of a plan's urls, expected at clock times a + position * b."""

    urls: Sequence[str]
    start: int
    end: int
    a: float
    b: float


def nearest_first(windows: Iterable[Window], skip: Callable[[str], bool], limit: int) -> list[str]:
    """Up to `limit` urls of the prefetch windows not skipped, by the time their window expects them.

    A url inside two windows keeps the nearer time. Ranking by the window's own time needs no index
    look-up per url; the eviction check (`farthest_next_use`) still uses the true nearest use.
    """
    found: dict[str, float] = {}
    skipped: set[str] = set()
    for window in windows:
        for position in range(window.start, window.end):
            url = window.urls[position]
            when = window.a + position * window.b
            if url in found:
                found[url] = min(found[url], when)
            elif url not in skipped:
                if skip(url):
                    skipped.add(url)
                else:
                    found[url] = when
    return sorted(found, key=found.__getitem__)[:limit]
