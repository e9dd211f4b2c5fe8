"""Shard lists a job uploads once (`PUT /v1/shardlists/{digest}`), named by the sha256 of their body.

A plan over a shard list names positions in it instead of urls: the urls are read, checked against the
allow-list and given ids once per list (planbody.read_shardlist), and every epoch's plan of every slot of
the job reuses them. A list keeps its url ids and, when they are distinct, each position's rank among them,
so a plan's sorted pairs (plans.PlanArrays) come from one scatter over the list's length instead of a sort
(a 10^6-url plan in ~10 ms). The daemon keeps the lists used last, up to `max_urls` urls in all (12 bytes
a url: 48 MB by default); a plan naming one it no longer has is answered 404 `unknown_shardlist`, and the
client uploads it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardcached.errors import NotFound
from shardcached.planning.plans import PlanArrays

MAX_URLS = 4_000_000  # urls in the shard lists kept, all lists together (4 bytes a url, 8 more if distinct)


@dataclass(frozen=True, eq=False)
class ShardListIds:
    """One uploaded shard list: its digest, its url ids by position, and their ranks (see the module)."""

    digest: str
    ids: npt.NDArray[np.int32]
    ranks: npt.NDArray[np.int64] | None  # rank of each position's id among the list's; None if ids repeat

    @classmethod
    def of(cls, digest: str, ids: npt.NDArray[np.int32]) -> ShardListIds:
        """The list of `ids` (blocking: one sort of them)."""
        order = np.argsort(ids, kind="stable")
        ranks: npt.NDArray[np.int64] | None = None
        if len(ids) < 2 or bool(np.all(ids[order[1:]] != ids[order[:-1]])):
            ranks = np.empty(len(ids), dtype=np.int64)
            ranks[order] = np.arange(len(ids), dtype=np.int64)
        return cls(digest, ids, ranks)

    def plan(self, positions: npt.NDArray[np.int32]) -> PlanArrays:
        """The arrays of a plan reading the list's `positions` in order (blocking)."""
        ids = self.ids[positions]
        count = len(positions)
        if self.ranks is None or count * 8 < len(self.ids):
            return PlanArrays.of(ids)  # repeats in the list, or a short plan: a sort is as cheap
        # Each position's rank is distinct unless the plan repeats one: place the plan's positions by rank.
        at_rank = np.full(len(self.ids), -1, dtype=np.int64)
        at_rank[self.ranks[positions]] = np.arange(count, dtype=np.int64)
        by_id = at_rank[at_rank >= 0]
        if len(by_id) != count:
            return PlanArrays.of(ids)  # the plan repeats a position (padding, resampling)
        return PlanArrays(ids, (ids[by_id].astype(np.int64) << 32) | by_id)


class ShardLists:
    """The shard lists the daemon holds, by digest, the last used kept (thread-safe)."""

    def __init__(self, max_urls: int = MAX_URLS) -> None:
        self.max_urls = max_urls
        self._lists: OrderedDict[str, ShardListIds] = OrderedDict()
        self._urls = 0
        self._lock = threading.Lock()

    def __contains__(self, digest: str) -> bool:
        return digest in self._lists

    def put(self, listed: ShardListIds) -> None:
        with self._lock:
            known = self._lists.pop(listed.digest, None)
            self._urls -= 0 if known is None else len(known.ids)
            self._lists[listed.digest] = listed
            self._urls += len(listed.ids)
            while self._urls > self.max_urls and len(self._lists) > 1:  # the newest is always kept
                _, dropped = self._lists.popitem(last=False)
                self._urls -= len(dropped.ids)

    def find(self, digest: str) -> ShardListIds | None:
        """The list named `digest`, or None."""
        with self._lock:
            return self._lists.get(digest)

    def get(self, digest: str) -> ShardListIds:
        """The list named `digest`.

        Raises:
            NotFound: 404 `unknown_shardlist`: never uploaded, or dropped since (upload it again).
        """
        with self._lock:
            listed = self._lists.get(digest)
            if listed is not None:
                self._lists.move_to_end(digest)
        if listed is None:
            raise NotFound(
                f"shard list {digest} is not known to the daemon (never uploaded, or dropped since): upload "
                f"it with PUT /v1/shardlists/{digest}, then register the plan again",
                code="unknown_shardlist",
            )
        return listed
