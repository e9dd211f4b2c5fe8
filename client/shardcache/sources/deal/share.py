"""One slot's share of an epoch's deal, computed for that slot: `plan_epoch(...)[slot]`, the same pieces.

A reader needs its own slot's pieces, not every slot's. `slot_share` gives them without building the
deal's per-unit objects (a `Piece` per unit of the dataset, then lists of them per slot):

- Whole units without `even=` or `exchange=`: the slot's stride of positions of its group's order, mapped
  one by one (`order_at`): O(n / slots) per epoch; with node groups the groups' members come first,
  O(n log groups), once per process (`group_members`).
- `exchange=` (units moved between node groups per epoch) and `even=` (the cut at sample granularity,
  which needs the sample count before every position of a group's order): passes over every unit, done on
  numpy arrays (the exchange draw, a selection, a cumulative sum), with `Piece`s made for this slot's share
  only. The cut's boundary rule (`cut`: a piece split between two slices gives its tail to the slice that
  needs more than half of it) is replayed for the few pieces that straddle this slot's edges.

An elastic resume (pieces that are not whole units) still plans the whole deal (`plan_epoch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardcache.memo import IdentityMemo
from shardcache.sources.deal.order import order_at, shuffled
from shardcache.sources.deal.partition import (
    PLACEMENT_SEED,
    Layout,
    Partitioning,
    Piece,
    exchanged_owner,
    node_members,
)

_MEMBERS: IdentityMemo[tuple[np.ndarray, ...]] = IdentityMemo()
_INT = np.int64


def group_members(weights: tuple[float, ...], groups: int) -> tuple[np.ndarray, ...]:
    """`node_members` as int64 arrays, memoised per process by the identity of `weights`: looking a tuple
    of 10^6 weights up in `node_members`' cache hashes all of it, every epoch."""
    return _MEMBERS.get(
        weights,
        groups,
        lambda: tuple(np.asarray(m, dtype=_INT) for m in node_members(weights, groups, PLACEMENT_SEED)),
    )


def slot_share(
    n: int,
    weights: Callable[[], tuple[float, ...]],
    layout: Layout,
    partitioning: Partitioning,
    seed: int,
    epoch: int,
    round_index: int,
    slot: int,
    shuffle: bool = True,
    counts: Callable[[], Sequence[int]] | None = None,
    fixed_owner: Sequence[int] | None = None,
) -> list[Piece] | None:
    """Slot `slot`'s pieces of a deal of n whole units: `plan_epoch(...)[slot]` computed for this slot.

    `weights()` gives the units' placement weights (called only with several node groups, and no
    `fixed_owner`); `counts()` every unit's sample count (called only for `even=`); `fixed_owner` each
    unit's node group when a larger dataset decided it (a mini-epoch's chunk). None where this does not
    apply: `even=` without `counts`.
    """
    groups = layout.groups if partitioning.placement == "node" else 1
    if groups == 1:
        fixed_owner = None  # one group owns everything, as `plan_epoch` reads it
    if partitioning.even is not None and counts is None:
        return None
    per_group = layout.total_slots // groups
    g, j = divmod(slot, per_group)
    exchange = partitioning.exchange if groups > 1 else 0.0
    salt = f":g{g}" if groups > 1 else ""
    if partitioning.even is None and not exchange and fixed_owner is None:
        if groups == 1:
            return _stride(n, None, j, per_group, seed, epoch, round_index, salt, shuffle)
        members = group_members(weights(), groups)[g]
        return _stride(len(members), members, j, per_group, seed, epoch, round_index, salt, shuffle)
    by_rank = _rank_order(n, weights, groups, fixed_owner)  # the units in canonical order
    owner = _owner(n, weights, groups, fixed_owner)
    if exchange:
        owner = exchanged_owner(owner, exchange, groups, seed, epoch)
    if partitioning.even is None:
        mine = by_rank[owner[by_rank] == g]  # group g's units in canonical order
        return _stride(len(mine), mine, j, per_group, seed, epoch, round_index, salt, shuffle)
    assert counts is not None
    sizes = np.asarray(counts(), dtype=_INT)
    deal = _EvenDeal(sizes, by_rank, owner, groups, layout, partitioning)
    return deal.share(seed, epoch, round_index, g, j, shuffle)


def _stride(
    size: int,
    units: np.ndarray | None,
    j: int,
    per_group: int,
    seed: int,
    epoch: int,
    round_index: int,
    salt: str,
    shuffle: bool,
) -> list[Piece]:
    """Slot j's pieces of its group's `size` units (`units` in canonical order; None: 0 .. size - 1): the
    positions of the group's order congruent to j (shifted by the round), each mapped alone (`order_at`),
    O(size / per_group)."""
    positions = np.arange((j - round_index * size) % per_group, size, per_group, dtype=_INT)
    if shuffle:
        positions = order_at(positions, size, seed, epoch, round_index, salt)
    chosen = positions if units is None else units[positions]
    return [Piece(u) for u in chosen.tolist()]


def _rank_order(
    n: int, weights: Callable[[], tuple[float, ...]], groups: int, fixed_owner: Sequence[int] | None
) -> np.ndarray:
    if groups == 1 or fixed_owner is not None:
        return np.arange(n, dtype=_INT)
    return np.concatenate(group_members(weights(), groups))


def _owner(
    n: int, weights: Callable[[], tuple[float, ...]], groups: int, fixed_owner: Sequence[int] | None
) -> np.ndarray:
    if groups == 1:
        return np.zeros(n, dtype=_INT)
    if fixed_owner is not None:
        return np.asarray(fixed_owner, dtype=_INT)
    owner = np.empty(n, dtype=_INT)
    for g, members in enumerate(group_members(weights(), groups)):
        owner[members] = g
    return owner


@dataclass(frozen=True)
class _Stream:
    """Pieces in reading order, as arrays: unit, start, stop, pad."""

    unit: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    pad: np.ndarray

    def __len__(self) -> int:
        return len(self.unit)

    def take(self, index: np.ndarray) -> _Stream:
        return _Stream(self.unit[index], self.start[index], self.stop[index], self.pad[index])

    def nonempty(self) -> _Stream:
        return self.take(np.flatnonzero(self.stop > self.start))

    @staticmethod
    def join(first: _Stream, second: _Stream) -> _Stream:
        return _Stream(
            np.concatenate([first.unit, second.unit]),
            np.concatenate([first.start, second.start]),
            np.concatenate([first.stop, second.stop]),
            np.concatenate([first.pad, second.pad]),
        )

    def pieces(self) -> list[Piece]:
        fields = (self.unit.tolist(), self.start.tolist(), self.stop.tolist(), self.pad.tolist())
        return [Piece(u, a, b, p) for u, a, b, p in zip(*fields, strict=True)]


@dataclass(frozen=True)
class _EvenDeal:
    """`plan_epoch`'s even branch (see there for what each step means), for one slot at a time."""

    sizes: np.ndarray  # every unit's samples
    by_rank: np.ndarray  # the units in canonical order
    owner: np.ndarray  # every unit's node group this epoch
    groups: int
    layout: Layout
    partitioning: Partitioning

    def share(self, seed: int, epoch: int, round_index: int, g: int, j: int, shuffle: bool) -> list[Piece]:
        """Slot j of group g."""
        groups, layout = self.groups, self.layout
        total = int(self.sizes.sum())
        ranks, workers = layout.ranks, layout.workers
        per_rank = total // ranks if self.partitioning.even == "drop" else -(-total // ranks)
        ranks_per_group = ranks // groups
        share = ranks_per_group * per_rank
        # The canonical stream: group by group, each in canonical order; its fixed cut into the groups.
        by_rank = self.by_rank
        units = by_rank[np.argsort(self.owner[by_rank], kind="stable")] if groups > 1 else by_rank
        canonical = _whole(units, self.sizes)
        group_lengths = [share] * (groups - 1) + [max(0, total - share * (groups - 1))]
        fixed = _slice(canonical.nonempty(), _lengths_bounds(group_lengths), g)
        salt = f":g{g}" if groups > 1 else ""
        stream = fixed.take(shuffled(len(fixed), seed, epoch, round_index, salt)) if shuffle else fixed
        if self.partitioning.even == "pad":
            source = stream
            if not len(stream):  # an empty group repeats from the canonical stream's own epoch order
                fallback = ":g-1" if groups > 1 else ""
                order = shuffled(len(canonical), seed, epoch, round_index, fallback) if shuffle else None
                source = canonical if order is None else canonical.take(order)
            stream = _padded(stream, share, source.nonempty())
        lengths = [(w + 1) * per_rank // workers - w * per_rank // workers for w in range(workers)]
        return _slice(stream.nonempty(), _lengths_bounds(lengths * ranks_per_group), j).pieces()


def _whole(units: np.ndarray, sizes: np.ndarray) -> _Stream:
    zeros = np.zeros(len(units), dtype=_INT)
    return _Stream(units, zeros, sizes[units], np.zeros(len(units), dtype=bool))


def _lengths_bounds(lengths: Sequence[int]) -> np.ndarray:
    """The slices' edges in samples: slice k is [bounds[k], bounds[k + 1])."""
    return np.concatenate([np.zeros(1, dtype=_INT), np.cumsum(np.asarray(lengths, dtype=_INT))])


def _padded(stream: _Stream, want: int, source: _Stream) -> _Stream:
    """`partition._padded`: `stream`, then `source`'s pieces again from the start (marked pad) until the
    stream holds `want` samples, the last one cut to fit."""
    have = int((stream.stop - stream.start).sum())
    need = want - have
    if need <= 0 or not len(source):
        return stream
    sizes = source.stop - source.start
    cycle = int(sizes.sum())
    rounds = -(-need // cycle)
    tiled = source.take(np.tile(np.arange(len(source)), rounds))
    ends = np.cumsum(tiled.stop - tiled.start)
    keep = int(np.searchsorted(ends, need, side="left")) + 1
    tiled = tiled.take(np.arange(keep))
    over = int(ends[keep - 1]) - need  # the last piece's samples past `want`
    stop = tiled.stop.copy()
    stop[-1] -= over
    extra = _Stream(tiled.unit, tiled.start, stop, np.ones(keep, dtype=bool))
    return _Stream.join(stream, extra)


def _slice(stream: _Stream, bounds: np.ndarray, k: int) -> _Stream:
    """`partition.cut(stream, lengths)[k]` for the lengths whose edges are `bounds` (pieces of size > 0).

    Pieces inside the slice are whole; a piece across an edge is split as `cut` splits it, which depends on
    every edge inside that piece, so those are replayed for it (`_part_of`).
    """
    lo, hi = int(bounds[k]), int(bounds[k + 1])
    if lo >= hi or not len(stream):
        return stream.take(np.zeros(0, dtype=_INT))
    sizes = stream.stop - stream.start
    ends = np.cumsum(sizes)
    begins = ends - sizes
    first = int(np.searchsorted(ends, lo, side="right"))  # the first piece ending after lo
    last = int(np.searchsorted(begins, hi, side="left"))  # one past the last piece beginning before hi
    if first >= last:
        return stream.take(np.zeros(0, dtype=_INT))
    index = np.arange(first, last)
    part = stream.take(index)
    start, stop = part.start.copy(), part.stop.copy()
    for at in {0, len(index) - 1}:
        begin, end = int(begins[first + at]), int(ends[first + at])
        if begin < lo or end > hi:
            a, b = _part_of(begin, end, bounds, k)
            start[at], stop[at] = int(part.start[at]) + a, int(part.start[at]) + b
    out = _Stream(part.unit, start, stop, part.pad)
    return out.nonempty()


def _part_of(begin: int, end: int, bounds: np.ndarray, k: int) -> tuple[int, int]:
    """The samples [a, b) (relative to the piece) that slice k takes of the piece at [begin, end) of the
    stream, replaying `cut` over every slice that takes from the piece, in order."""
    lo, hi = 0, end - begin
    first = int(np.searchsorted(bounds, begin, side="right")) - 1  # the slice the piece starts in
    last = min(int(np.searchsorted(bounds, end, side="left")), len(bounds) - 1)  # one past its last slice
    for slice_index in range(first, last):
        need = int(bounds[slice_index + 1]) - max(begin, int(bounds[slice_index]))
        size = hi - lo
        if need <= 0:
            taken = (lo, lo)
        elif size <= need:
            taken, lo = (lo, hi), hi
        elif need <= size // 2:
            taken, lo = (lo, lo + need), lo + need
        else:
            taken, hi = (hi - need, hi), hi - need
        if slice_index == k:
            return taken
    return (0, 0)
