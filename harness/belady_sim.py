"""Offline cache simulators over an access trace: Belady's MIN (full or plan-window knowledge) and LRU.

Shards are unit-sized (the benchmarks use equal shards), every miss is one remote fetch, and a missed shard
is always admitted (the daemon must cache what it serves). These are the yardsticks the planner is measured
against, by the property tests in ``tests/daemon`` and by ``bench/bench_egress.py``.

*Plan-window knowledge* models what the clients tell the daemon: when a slot starts epoch ``e`` it registers
its plans for ``e`` and ``e + 1``. At trace index ``t`` an access ``j > t`` is known iff its epoch is at most
its slot's current epoch (that of its latest access at or before ``t``, or its first epoch if it has not
started) plus ``lookahead_epochs``. Unknown next uses count as "never"; ties among those go by recency,
least recent first, as in the daemon's planner.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Access:
    """One open: which slot (any hashable, e.g. ``(job, slot)``), in which epoch, of which url."""

    slot: Hashable
    epoch: int
    url: str


def lru_fetches(trace: Sequence[Access], capacity: int) -> int:
    """Fetches made by a least-recently-used cache of `capacity` shards."""
    resident: dict[str, None] = {}  # insertion order = recency order
    fetches = 0
    for access in trace:
        if access.url in resident:
            del resident[access.url]
        else:
            fetches += 1
            if len(resident) >= capacity:
                del resident[next(iter(resident))]
        resident[access.url] = None
    return fetches


def min_fetches(trace: Sequence[Access], capacity: int, lookahead_epochs: int | None = None) -> int:
    """Fetches made by Belady's MIN with full knowledge (`lookahead_epochs=None`) or plan-window knowledge.

    Args:
        trace: the accesses in global order.
        capacity: cache size in shards (>= 1).
        lookahead_epochs: None for the whole future; 1 for "current and next epoch" per slot.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 shard, got {capacity}")
    occurrences: dict[str, list[int]] = {}
    first_epoch: dict[Hashable, int] = {}
    for index, access in enumerate(trace):
        occurrences.setdefault(access.url, []).append(index)
        first_epoch.setdefault(access.slot, access.epoch)
    current_epoch = dict(first_epoch)
    last_use: dict[str, int] = {}
    resident: set[str] = set()
    fetches = 0

    def next_known(url: str, now: int) -> float:
        for j in occurrences[url]:
            if j <= now:
                continue
            access = trace[j]
            if lookahead_epochs is None or access.epoch <= current_epoch[access.slot] + lookahead_epochs:
                return j
        return float("inf")

    for now, access in enumerate(trace):
        current_epoch[access.slot] = access.epoch
        if access.url not in resident:
            fetches += 1
            if len(resident) >= capacity:
                victim = max(resident, key=lambda url: (next_known(url, now), -last_use[url]))
                resident.remove(victim)
            resident.add(access.url)
        last_use[access.url] = now
    return fetches
