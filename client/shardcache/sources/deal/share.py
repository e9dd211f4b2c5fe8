"""One slot's share of an epoch's deal, computed for that slot: `plan_epoch(...)[slot]`, the same pieces.

A reader needs its own slot's pieces, not every slot's. `slot_share` gives them without building the
deal's per-unit objects (a `Piece` per unit of the dataset, then lists of them per slot):

- Whole units without `even=` or `exchange=`: the slot's stride of positions of its group's order, mapped
  one by one (`order_at`): O(n / slots) per epoch; with node groups the groups' members come first,
  O(n log groups), once per process (`group_members`).
- `exchange=` (units moved between node groups per epoch) and `even=` (the cut at sample granularity,
  which needs the sample count before every position of a group's order): passes over every unit, done on
  numpy arrays (the exchange draw, a selection, the group's whole order, a cumulative sum of its sizes in
  that order), with `Piece`s made for this slot's share only (`sources.deal.streams`). The cut's boundary
  rule (`cut`: a piece split between two slices gives its tail to the slice that needs more than half of
  it) is replayed for the few pieces that straddle this slot's edges. ~25-70 ms per epoch at 10^6 units.

An elastic resume (pieces that are not whole units) still plans the whole deal (`plan_epoch`).
"""

from __future__ import annotations

import functools
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
from shardcache.sources.deal.streams import (
    Ordered,
    Pieces,
    Stream,
    compact,
    cut_slice,
    lengths_bounds,
    padded,
)

_INT = np.int64


def group_members(weights: tuple[float, ...], groups: int) -> tuple[np.ndarray, ...]:
    """`node_members` as int64 arrays, memoised per process by the identity of `weights`: looking a tuple
    of 10^6 weights up in `node_members`' cache hashes all of it, every epoch."""
    return _MEMBERS.get(
        weights,
        groups,
        lambda: tuple(np.asarray(m, dtype=_INT) for m in node_members(weights, groups, PLACEMENT_SEED)),
    )


_MEMBERS: IdentityMemo[tuple[np.ndarray, ...]] = IdentityMemo()


@dataclass(frozen=True)
class _Placement:
    """The units' node groups before any exchange, as arrays."""

    by_rank: np.ndarray  # the units in canonical order (group by group)
    owner: np.ndarray  # each unit's group (int64, by unit)
    ranked: np.ndarray  # each canonical position's group (`owner[by_rank]`, compact)

    @staticmethod
    def of(
        n: int, weights: Callable[[], tuple[float, ...]], groups: int, fixed_owner: Sequence[int] | None
    ) -> _Placement:
        if fixed_owner is not None:  # a larger dataset decided it: canonical order is the unit order
            owner = np.asarray(fixed_owner, dtype=_INT)
            return _Placement(np.arange(n, dtype=_INT), owner, compact(owner))
        if groups == 1:
            return _one_group(n)
        found = weights()
        return _PLACEMENTS.get(found, groups, lambda: _Placement._of_members(group_members(found, groups)))

    @staticmethod
    def _of_members(members: tuple[np.ndarray, ...]) -> _Placement:
        owner = np.empty(sum(len(m) for m in members), dtype=_INT)
        for g, units in enumerate(members):
            owner[units] = g
        ranked = np.repeat(np.arange(len(members), dtype=_INT), [len(m) for m in members])
        return _Placement(np.concatenate(members), owner, compact(ranked))

    def exchanged(self, fraction: float, groups: int, seed: int, epoch: int) -> np.ndarray:
        """Each canonical position's group this epoch (`exchanged_owner`), compact."""
        ranked: np.ndarray = compact(exchanged_owner(self.owner, fraction, groups, seed, epoch))[self.by_rank]
        return ranked


_PLACEMENTS: IdentityMemo[_Placement] = IdentityMemo()


@functools.lru_cache(maxsize=4)
def _one_group(n: int) -> _Placement:
    """Every unit in group 0, canonical order the unit order (read-only arrays, kept per n)."""
    placement = _Placement(np.arange(n, dtype=_INT), np.zeros(n, dtype=_INT), np.zeros(n, dtype=np.uint8))
    for array in (placement.by_rank, placement.owner, placement.ranked):
        array.setflags(write=False)
    return placement


def _unit_sizes(counts: Sequence[int]) -> np.ndarray:
    """Every unit's samples as int64, memoised by the identity of `counts` (a manifest's counts are one
    list per process; converting 10^6 Python ints costs ~0.1 s)."""
    return _SIZES.get(counts, None, lambda: _read_only(np.asarray(counts, dtype=_INT)))


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)  # shared by every epoch's streams: none may write into it
    return array


_SIZES: IdentityMemo[np.ndarray] = IdentityMemo()


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
    placement = _Placement.of(n, weights, groups, fixed_owner)
    ranked = placement.exchanged(exchange, groups, seed, epoch) if exchange else placement.ranked
    if partitioning.even is None:
        mine = placement.by_rank[ranked == g]  # group g's units in canonical order
        return _stride(len(mine), mine, j, per_group, seed, epoch, round_index, salt, shuffle)
    assert counts is not None
    deal = _EvenDeal(_unit_sizes(counts()), placement.by_rank, ranked, groups, layout, partitioning)
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


@dataclass(frozen=True)
class _EvenDeal:
    """`plan_epoch`'s even branch (see there for what each step means), for one slot at a time."""

    sizes: np.ndarray  # every unit's samples (int64, by unit)
    by_rank: np.ndarray  # the units in canonical order
    ranked: np.ndarray  # each canonical position's node group this epoch
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
        # The canonical stream (group by group, each in canonical order), cut into the groups' fixed parts.
        group_lengths = [share] * (groups - 1) + [max(0, total - share * (groups - 1))]
        fixed = self._fixed(lengths_bounds(group_lengths), g)
        salt = f":g{g}" if groups > 1 else ""
        stream: Pieces = (
            Ordered(fixed, shuffled(len(fixed), seed, epoch, round_index, salt)) if shuffle else fixed
        )
        if self.partitioning.even == "pad":
            source = stream
            if not len(stream):  # an empty group repeats from the canonical stream's own epoch order
                canonical = self._canonical()
                fallback = ":g-1" if groups > 1 else ""
                order = shuffled(len(canonical), seed, epoch, round_index, fallback) if shuffle else None
                source = (canonical if order is None else canonical.take(order)).nonempty()
            stream = padded(stream, share, source)
        lengths = [(w + 1) * per_rank // workers - w * per_rank // workers for w in range(workers)]
        return cut_slice(stream, lengths_bounds(lengths * ranks_per_group), j).pieces()

    def _fixed(self, bounds: np.ndarray, g: int) -> Stream:
        """Group g's fixed part of the canonical stream: its slice `bounds[g]` .. `bounds[g + 1]`, from
        the units of the groups whose samples it spans only (one pass over the positions per such group)."""
        if self.groups == 1:  # the one group's part is the whole stream (its bounds are 0 and the total)
            return self._canonical().nonempty()
        ranked_sizes = compact(self.sizes)[self.by_rank]
        totals = np.bincount(self.ranked, weights=ranked_sizes, minlength=self.groups).astype(_INT)
        starts = lengths_bounds(totals.tolist())
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        spanned = [h for h in range(self.groups) if totals[h] and starts[h] < hi and starts[h + 1] > lo]
        if not spanned:
            return Stream.empty()
        positions = np.concatenate([np.flatnonzero(self.ranked == h) for h in spanned])
        part = Stream.whole(self.by_rank[positions], ranked_sizes[positions].astype(_INT))
        return cut_slice(part.nonempty(), bounds - starts[spanned[0]], g)

    def _canonical(self) -> Stream:
        """The whole canonical stream, zero-sample units included."""
        if self.groups == 1:  # canonical order is the unit order
            return Stream.whole(self.by_rank, self.sizes)
        units = self.by_rank[np.argsort(self.ranked, kind="stable")]
        return Stream.whole(units, self.sizes[units])
