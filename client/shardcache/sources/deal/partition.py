"""Which samples each slot reads in an epoch: node placement and equal work per rank, in one layer.

A source's units (tar shards, jsonl files, parquet row groups) are dealt to slots (data-parallel rank ×
DataLoader worker) in two steps:

1. Node groups (`placement="node"`): every node group (normally one node, see `RuntimeContext.node_groups`)
   owns a fixed share of the units, the same in every epoch, so the node's daemon keeps serving it from its
   cache. The shares come from `node_members`: a consistent, weight-balanced assignment (by samples when
   every unit's count is known, else by bytes, else by unit). It is built by adding groups one at a time,
   each new group taking its share from the heaviest groups, so going from N to N+1 groups moves only the
   new group's share (about 1/(N+1) of the data), and going back returns it. `exchange=f` moves a random
   fraction f of the units to other groups for one epoch (drawn per epoch): more mixing across nodes for
   about f of the dataset in extra downloads per epoch. `placement="global"` is one group: every epoch
   deals a fresh permutation of all units to all slots (the behaviour before node placement existed).

2. Slots. Without `even`, each group's units are permuted per (seed, epoch, round) and slot j of the group
   takes the positions congruent to j: whole units, exactly once per epoch, but ranks may get different
   numbers of samples. With `even="drop"|"pad"` (needs every unit's sample count), the data is cut at
   sample granularity so every data-parallel rank gets exactly P samples: P = N // ranks ("drop", fewer
   than `ranks` samples left out per epoch, different ones each epoch) or ceil(N / ranks) ("pad", the
   missing ones repeated from the same group's epoch order and marked). First the groups' fixed sets: the
   units in canonical order (group by group) are cut into consecutive ranges of ranks_per_group × P
   samples, so a group whose share is a little larger than its ranks need hands the same few samples to
   the next group every epoch (cached there too). Then, per epoch, each group permutes its pieces and cuts
   them into P samples per rank and P/workers per worker: every rank has the same worker split, hence the
   same number of samples and worker-side batches.

A `Piece` is a unit's sample range; a resumed epoch on another topology (`shardcache.resume.elastic`) is
planned from the remaining pieces instead of whole units, with the same two steps.

Orders come from `sources.deal.order` (a keyed bijection evaluated position by position). A reader of whole
units plans its own slot only (`sources.deal.share.slot_share`, the same pieces as `plan_epoch`'s row for
that slot); `plan_epoch` plans every slot, which an elastic replay (pieces that are not whole units) needs,
and which defines the deal.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.shards import ShardRef
from shardcache.sources.deal.order import order_key, permutation

PLACEMENTS = ("global", "node")
EVEN_MODES = ("drop", "pad")
# Node shares do not depend on the job's seed: a mix's later passes reshuffle with derived seeds, jobs with
# other seeds over the same shards share the nodes' caches, and only the order within a node is seeded.
PLACEMENT_SEED = 0


@dataclass(frozen=True)
class Unit:
    """One schedulable piece of a source: a shard, or part of one (`count`: its samples, when known)."""

    ref: ShardRef
    part: int = 0
    offset: int = 0
    count: int | None = None


class ShardUnits(Sequence[Unit]):
    """One whole-shard unit per shard, made when asked for: a reader of 10^6 shards builds the units of
    its share, not a million objects per epoch (`Unit(ref, count=ref.num_samples)` for each)."""

    def __init__(self, shards: Sequence[ShardRef]) -> None:
        self._shards = shards

    @property
    def shards(self) -> Sequence[ShardRef]:
        """The shard references the units are made from (one unit per shard, in this order)."""
        return self._shards

    def __len__(self) -> int:
        return len(self._shards)

    @overload
    def __getitem__(self, index: int) -> Unit: ...

    @overload
    def __getitem__(self, index: slice) -> list[Unit]: ...

    def __getitem__(self, index: int | slice) -> Unit | list[Unit]:
        if isinstance(index, slice):
            return [Unit(ref, count=ref.num_samples) for ref in self._shards[index]]
        ref = self._shards[index]
        return Unit(ref, count=ref.num_samples)

    def __iter__(self) -> Iterator[Unit]:
        return (Unit(ref, count=ref.num_samples) for ref in self._shards)


@dataclass(frozen=True)
class Piece:
    """Samples [start, stop) of unit `unit` (stop None: to the unit's end); `pad` marks repeated samples."""

    unit: int
    start: int = 0
    stop: int | None = None
    pad: bool = False

    @property
    def size(self) -> int:
        if self.stop is None:
            raise ValueError("the size of an open-ended piece is not known")
        return self.stop - self.start


@dataclass(frozen=True)
class Layout:
    """How readers are laid out: node groups, data-parallel ranks and DataLoader workers per rank."""

    groups: int
    ranks: int
    workers: int

    @classmethod
    def of(cls, ctx: RuntimeContext) -> Layout:
        return cls(ctx.node_groups, ctx.dp_size, ctx.num_workers)

    @property
    def ranks_per_group(self) -> int:
        return self.ranks // self.groups

    @property
    def slots_per_group(self) -> int:
        return self.ranks_per_group * self.workers

    @property
    def total_slots(self) -> int:
        return self.ranks * self.workers

    def as_dict(self) -> dict[str, int]:
        return {"groups": self.groups, "ranks": self.ranks, "workers": self.workers}


@dataclass(frozen=True)
class Partitioning:
    """A source's partitioning options: placement, equal work and the cross-node exchange fraction."""

    placement: str = "global"
    even: str | None = None
    exchange: float = 0.0

    def as_list(self) -> list[str | float | None]:
        """[placement, even, exchange]: how states record it."""
        return [self.placement, self.even, self.exchange]

    @property
    def layered(self) -> bool:
        """Whether anything beyond the plain global deal applies."""
        return self.placement == "node" or self.even is not None


def check_partition_options(options: Mapping[str, object]) -> None:
    """Validate `placement`, `even` and `exchange`."""
    placement = options.get("placement", "auto")
    if placement not in ("auto", *PLACEMENTS):
        raise ConfigError(f"placement={placement!r}: expected 'auto', 'node' or 'global'")
    even = options.get("even", "auto")
    if even not in ("auto", None, *EVEN_MODES):
        raise ConfigError(f"even={even!r}: expected 'auto', 'drop', 'pad' or None")
    exchange = options.get("exchange", 0.0)
    if isinstance(exchange, bool) or not isinstance(exchange, int | float) or not 0.0 <= exchange <= 1.0:
        raise ConfigError(f"exchange={exchange!r}: expected a fraction in [0, 1] (of each node's units)")
    if exchange and placement == "global":
        raise ConfigError("exchange= moves units between nodes under placement='node'; drop it for 'global'")


def resolve(
    placement: str, even: str | None, exchange: float, ctx: RuntimeContext, distributed: bool
) -> Partitioning:
    """The partitioning a source uses in `ctx` (its `placement`, `even` and `exchange` options): 'auto'
    placement is node with several node groups, and 'auto' even is 'drop' when torch.distributed runs several
    data-parallel ranks (a plain DDP loop then never waits for a rank that has run out)."""
    if placement == "auto":
        placement = "node" if ctx.node_groups > 1 else "global"
    if even == "auto":
        even = "drop" if distributed and ctx.dp_size > 1 else None
    return Partitioning(placement, even, float(exchange))


@functools.lru_cache(maxsize=16)
def node_members(weights: tuple[float, ...], groups: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """The units of each node group, in canonical order: fixed across epochs (see the module).

    Groups are added one at a time: the new group takes units from the end of the heaviest groups' lists
    until it holds about total / groups (always from the group that is heaviest now, so the old groups
    drain evenly; a group gives a unit while neither ends up more than half a unit past its target; then
    the heaviest gives while it stays at least as heavy as the new group). A unit therefore only ever
    moves to the group being added, and groups of equal units differ by at most one unit.
    """
    members: list[list[int]] = [permutation(len(weights), seed, -1, 0, ":placement")]
    load = [float(sum(weights))]
    for k in range(2, groups + 1):
        target = load[0] and sum(load) / k
        new: list[int] = []
        got = 0.0
        heaviest = [(-load[i], i) for i in range(k - 1)]
        heapq.heapify(heaviest)
        while heaviest:  # a group that cannot give now never can later in this step: it leaves the heap
            i = heapq.heappop(heaviest)[1]
            units = members[i]
            if (
                units
                and load[i] - weights[units[-1]] / 2 >= target
                and got + weights[units[-1]] / 2 <= target
            ):
                unit = units.pop()
                load[i] -= weights[unit]
                got += weights[unit]
                new.append(unit)
                heapq.heappush(heaviest, (-load[i], i))
        while True:  # round off: the heaviest gives while it stays at least as heavy as the new group
            i = max(range(k - 1), key=load.__getitem__)
            units = members[i]
            if not units or load[i] - weights[units[-1]] < got + weights[units[-1]]:
                break
            unit = units.pop()
            load[i] -= weights[unit]
            got += weights[unit]
            new.append(unit)
        members.append(new)
        load.append(got)
    return tuple(tuple(m) for m in members)


def owners(weights: tuple[float, ...], groups: int, seed: int) -> list[int]:
    """The node group of each unit (see `node_members`)."""
    owner = [0] * len(weights)
    for g, units in enumerate(node_members(weights, groups, seed)):
        for u in units:
            owner[u] = g
    return owner


def exchanged(owner: list[int], fraction: float, groups: int, seed: int, epoch: int) -> list[int]:
    """`owner` with a random `fraction` of the units moved to another group this epoch (`exchanged_owner`)."""
    if not fraction or groups < 2:
        return owner
    moved = exchanged_owner(np.asarray(owner, dtype=np.int64), fraction, groups, seed, epoch)
    return moved.tolist()  # type: ignore[no-any-return]


def exchanged_owner(owner: np.ndarray, fraction: float, groups: int, seed: int, epoch: int) -> np.ndarray:
    """`owner` (an int64 array) with a random `fraction` of the units moved to another group for this epoch
    (drawn per epoch, vectorised: O(n) per epoch, the one per-epoch pass over every unit that `exchange=`
    costs)."""
    if not fraction or groups < 2:
        return owner
    rng = np.random.default_rng(order_key(seed, epoch, 0, ":exchange"))
    moves = rng.random(len(owner)) < fraction
    shift = 1 + rng.integers(0, groups - 1, size=len(owner))
    return np.where(moves, (owner + shift) % groups, owner)


def cut(pieces: Sequence[Piece], lengths: Sequence[int]) -> list[list[Piece]]:
    """Consecutive slices of `lengths` samples of the piece stream (pieces split at the boundaries).

    A piece split between two slices gives the slice that needs more than half of it its tail, so the
    reader that must start inside the unit (a tar reader walks the headers before its first sample) skips
    at most half of it.
    """
    out: list[list[Piece]] = []
    it = iter(pieces)
    current: Piece | None = None
    for length in lengths:
        part: list[Piece] = []
        need = length
        while need > 0:
            if current is None:
                current = next(it, None)
                if current is None:
                    break
            size = current.size
            if size <= need:
                part.append(current)
                need -= size
                current = None
            elif need <= size // 2:
                part.append(Piece(current.unit, current.start, current.start + need, current.pad))
                current = Piece(current.unit, current.start + need, current.stop, current.pad)
                need = 0
            else:  # take the tail: whoever starts inside the unit then skips the smaller part of it
                stop = current.size + current.start
                part.append(Piece(current.unit, stop - need, stop, current.pad))
                current = Piece(current.unit, current.start, stop - need, current.pad)
                need = 0
        out.append([p for p in part if p.size])
    return out


def _padded(stream: list[Piece], want: int, fallback: Sequence[Piece]) -> list[Piece]:
    """`stream` extended to `want` samples by repeating itself (or `fallback`) from the start, marked pad."""
    have = sum(p.size for p in stream)
    source = [p for p in (stream or list(fallback)) if p.size]
    out = list(stream)
    while have < want and source:
        for piece in source:
            take = min(piece.size, want - have)
            out.append(Piece(piece.unit, piece.start, piece.start + take, True))
            have += take
            if have >= want:
                break
    return out


def plan_epoch(
    universe: Sequence[Piece],
    weights: tuple[float, ...],
    layout: Layout,
    partitioning: Partitioning,
    seed: int,
    epoch: int,
    round_index: int = 0,
    shuffle: bool = True,
    fixed_owner: Sequence[int] | None = None,
) -> list[list[Piece]]:
    """Every slot's pieces for one epoch (or resampling round), in reading order.

    Args:
        universe: The epoch's samples as pieces: every unit whole, or what a resumed epoch has left.
        weights: Every unit's weight for node placement (samples, bytes or 1; see the module).
        layout: Node groups, ranks and workers.
        partitioning: Placement, even mode and exchange fraction.
        seed, epoch, round_index: What the orders derive from.
        shuffle: Permute per epoch (False: canonical order, for sources that must not reorder).
        fixed_owner: Each unit's node group, decided by a larger dataset this one is part of (a mini-epoch
            chunk); canonical order is then the unit order.
    """
    groups = layout.groups if partitioning.placement == "node" else 1
    if groups > 1:
        if fixed_owner is not None:
            owner, rank = list(fixed_owner), {u: u for u in range(len(weights))}
        else:
            owner = owners(weights, groups, PLACEMENT_SEED)
            members = node_members(weights, groups, PLACEMENT_SEED)
            rank = {u: i for i, u in enumerate(u for m in members for u in m)}
        owner = exchanged(owner, partitioning.exchange, groups, seed, epoch)
        group_lists: list[list[Piece]] = [[] for _ in range(groups)]
        for piece in sorted(universe, key=lambda p: (rank[p.unit], p.start)):
            group_lists[owner[piece.unit]].append(piece)
    else:
        group_lists = [list(universe)]
    per_group = layout.total_slots // groups

    def order(pieces: list[Piece], g: int) -> list[Piece]:
        if not shuffle:
            return pieces
        salt = f":g{g}" if groups > 1 else ""
        return [pieces[i] for i in permutation(len(pieces), seed, epoch, round_index, salt)]

    slots: list[list[Piece]] = []
    if partitioning.even is None:
        base = round_index * len(universe) if groups == 1 else round_index
        for g, pieces in enumerate(group_lists):
            ordered = order(pieces, g)
            shift = base if groups == 1 else round_index * len(ordered)
            for j in range(per_group):  # the positions i with (shift + i) % per_group == j
                slots.append(ordered[(j - shift) % per_group :: per_group])
        return slots

    total = sum(p.size for p in universe)
    ranks, workers = layout.ranks, layout.workers
    per_rank = total // ranks if partitioning.even == "drop" else -(-total // ranks)
    ranks_per_group = ranks // groups
    share = ranks_per_group * per_rank
    canonical = [p for pieces in group_lists for p in pieces]
    fixed = cut(canonical, [share] * (groups - 1) + [max(0, total - share * (groups - 1))])
    worker_lengths = [(w + 1) * per_rank // workers - w * per_rank // workers for w in range(workers)]
    for g in range(groups):
        stream = order(fixed[g], g)
        if partitioning.even == "pad":
            stream = _padded(stream, share, order(canonical, -1))
        slots.extend(cut(stream, worker_lengths * ranks_per_group))
    return slots


def weights_of(counts: Sequence[int | None], sizes: Sequence[int | None]) -> tuple[float, ...]:
    """Node-placement weights: sample counts when every unit has one, else bytes, else one per unit.

    Only what metadata tells (manifests, parquet footers) may count here, never a counting pass: every
    process must compute the same placement before anything is counted.
    """
    if counts and all(c is not None for c in counts):
        return tuple(float(max(1, c or 0)) for c in counts)
    if sizes and all(s is not None for s in sizes):
        return tuple(float(max(1, s or 0)) for s in sizes)
    return (1.0,) * len(counts)
