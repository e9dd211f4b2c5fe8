"""The piece arithmetic of an elastic resume: what an epoch planned on one layout had left, as pieces.

A checkpoint's `origin` (`shardcache.resume.elastic`: the old layout, partitioning and every old slot's
progress) is replayed here, by the source node that resumes: the old plan is recomputed with
`plan_epoch`, and each old slot's unread part — the rest of its current piece, its later pieces, and what
a shuffle still buffered (replayed from its taken/emitted counts, as the shuffle's own resume does) —
becomes the pieces the new layout plans. Pure arithmetic over pieces and plans; no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from shardcache.buffer_shuffle import buffered_inputs
from shardcache.context import RuntimeContext
from shardcache.errors import StateError, UnsupportedResume
from shardcache.sources.deal.order import LEGACY_ORDER_VERSION, ORDER_KEY, check_order
from shardcache.sources.deal.partition import Layout, Partitioning, Piece, Unit, plan_epoch
from shardcache.sources.options import PlanHints

ShuffleParams = tuple[int, int | None, int | None]
"""A shuffle's (buffer_size, initial, seed), as `.shuffle()` was given them."""


@dataclass(frozen=True)
class ShuffleProgress:
    """How far an old reader's shuffle had gone: inputs taken from below it, outputs emitted."""

    taken: int
    emitted: int


@dataclass(frozen=True)
class LoaderShuffleOrigin:
    """An epoch read through a TorchLoader's own shuffle: its workers' batch size, the shuffle, and each
    old rank's shuffle progress (the rotation of the workers' batches is the loader's, `_loader_left`)."""

    batch: int
    shuffle: ShuffleParams
    ranks: Mapping[int, ShuffleProgress]


class LoaderShuffleOriginState(TypedDict):
    """`LoaderShuffleOrigin` as states carry it."""

    batch: int
    shuffle: list[int | None]
    ranks: dict[str, list[int]]


class OriginState(TypedDict):
    """`ElasticOrigin` as states carry it (`as_state`; `of` reads it back)."""

    epoch: int
    layout: dict[str, int] | None
    partitioning: list[str | float | None] | None
    slots: dict[str, list[int] | dict[str, int]]  # (piece, index), or a shuffle's taken/emitted
    exhausted: list[int]
    origin: OriginState | None
    order: object  # `ORDER_KEY`: the epoch order the old positions were taken in, as they recorded it
    shuffle: list[int | None] | None
    loader: LoaderShuffleOriginState | None


@dataclass(frozen=True)
class ElasticOrigin:
    """What an epoch planned on one layout had left, as an elastic resume on another layout replays it.

    Written by the resume side (`shardcache.resume.elastic`, `shardcache.loader.resume`) from the old
    readers' states, read only here. On disk (inside states) it is the JSON object `as_state` writes,
    unchanged since it was a plain dict, so states of earlier versions load.
    """

    epoch: int
    # The old layout and its partitioning [placement, even, exchange]; None when no old reader had started.
    layout: Layout | None
    partitioning: Partitioning | None
    # Each started old slot's progress: (piece index, sample within it), or its shuffle's progress.
    slots: Mapping[int, tuple[int, int] | ShuffleProgress]
    exhausted: frozenset[int]
    # The origin the old readers had themselves resumed from (an elastic resume of an elastic resume).
    origin: ElasticOrigin | None
    # The epoch order the old positions were taken in (`sources.deal.order`; earlier origins lack the key).
    order_version: object
    # The dataset's own shuffle the old slots ran, if any.
    shuffle: ShuffleParams | None
    loader: LoaderShuffleOrigin | None

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> ElasticOrigin:
        """The origin a state holds (StateError naming the field when it is not one)."""
        try:
            layout = None if state["layout"] is None else Layout(**state["layout"])
            partitioning = None if state["partitioning"] is None else Partitioning(*state["partitioning"])
            slots: dict[int, tuple[int, int] | ShuffleProgress] = {}
            for slot, progress in state["slots"].items():
                if isinstance(progress, dict):
                    slots[int(slot)] = ShuffleProgress(int(progress["taken"]), int(progress["emitted"]))
                else:
                    pos, index = progress
                    slots[int(slot)] = (int(pos), int(index))
            nested = state.get("origin")
            loader = state.get("loader")
            return cls(
                epoch=int(state["epoch"]),
                layout=layout,
                partitioning=partitioning,
                slots=slots,
                exhausted=frozenset(int(slot) for slot in state.get("exhausted", ())),
                origin=None if nested is None else cls.of(nested),
                order_version=state.get(ORDER_KEY, LEGACY_ORDER_VERSION),
                shuffle=None if state.get("shuffle") is None else _shuffle_params(state["shuffle"]),
                loader=None
                if loader is None
                else LoaderShuffleOrigin(
                    int(loader["batch"]),
                    _shuffle_params(loader["shuffle"]),
                    {int(r): ShuffleProgress(int(t), int(e)) for r, (t, e) in loader["ranks"].items()},
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(
                f"resume state field 'origin' is not an elastic resume's origin ({exc!r}); it was not "
                "written by shardcache"
            ) from exc

    def as_state(self) -> OriginState:
        """The JSON object states carry (the layout they always had)."""
        loader = self.loader
        return {
            "epoch": self.epoch,
            "layout": None if self.layout is None else self.layout.as_dict(),
            "partitioning": None if self.partitioning is None else self.partitioning.as_list(),
            "slots": {
                str(slot): {"taken": p.taken, "emitted": p.emitted}
                if isinstance(p, ShuffleProgress)
                else list(p)
                for slot, p in self.slots.items()
            },
            "exhausted": sorted(self.exhausted),
            "origin": None if self.origin is None else self.origin.as_state(),
            "order": self.order_version,  # ORDER_KEY
            "shuffle": None if self.shuffle is None else list(self.shuffle),
            "loader": None
            if loader is None
            else {
                "batch": loader.batch,
                "shuffle": list(loader.shuffle),
                "ranks": {str(r): [p.taken, p.emitted] for r, p in loader.ranks.items()},
            },
        }


def _progress_state(progress: tuple[int, int] | ShuffleProgress) -> list[int] | dict[str, int]:
    if isinstance(progress, ShuffleProgress):
        return {"taken": progress.taken, "emitted": progress.emitted}
    return list(progress)


def _shuffle_params(value: Sequence[Any]) -> ShuffleParams:
    buffer_size, initial, seed = value
    return int(buffer_size), initial, seed


class _Described(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def hints(self) -> PlanHints: ...

    @property
    def shuffles_units(self) -> bool: ...


class Replaying(Protocol):
    """What replaying an origin needs of the source node that resumes (`SourceNode` is one)."""

    @property
    def partitionable(self) -> bool: ...

    @property
    def spec(self) -> _Described: ...

    @property
    def ctx(self) -> RuntimeContext: ...

    def weights(self, units: Sequence[Unit]) -> tuple[float, ...]: ...


def needs_counts(origin: ElasticOrigin | None) -> bool:
    """Whether replaying `origin` (and the origins it resumed) needs every unit's sample count: an epoch
    cut with even= does, and so does a shuffle's progress (counted in samples); whole units are replayed
    by position without counting (which would read every shard of the dataset on every rank)."""
    while origin is not None:
        if origin.partitioning is not None and origin.partitioning.even is not None:
            return True
        if origin.loader is not None:
            return True
        if any(isinstance(p, ShuffleProgress) for p in origin.slots.values()):
            return True
        origin = origin.origin
    return False


def remaining_pieces(
    node: Replaying, units: Sequence[Unit], origin: ElasticOrigin, counts: list[int] | None
) -> list[Piece]:
    """What the epoch described by `origin` had left, as pieces of `units` (see `resume.elastic`)."""
    whole = [Piece(i, 0, None if counts is None else counts[i]) for i in range(len(units))]
    layout, partitioning = origin.layout, origin.partitioning
    if layout is None or partitioning is None:
        return whole
    check_order(origin.order_version, origin.epoch, "elastic resume state")
    nested = origin.origin
    universe = whole if nested is None else remaining_pieces(node, units, nested, counts)
    if not node.partitionable:
        raise UnsupportedResume(
            f"an elastic resume of a {node.spec.kind} source is not supported (it plans its rows itself): "
            "resume on the same topology"
        )
    if node.spec.hints.node_owners and layout.groups > 1:
        raise UnsupportedResume(
            "an elastic resume inside a mini-epoch chunk is not supported: resume the chunk on the same "
            "topology, or resume on the new topology at the next chunk boundary (start the next chunk)"
        )
    if node.spec.kind == "jsonl" and partitioning.placement == "global" and partitioning.even is None:
        raise UnsupportedResume(
            "an elastic resume of a jsonl source read with placement='global' and even=None (each file "
            "sliced over the old slots) is not supported: build it with placement='node' or even='drop'"
        )
    plan = plan_epoch(
        universe,
        node.weights(units),
        layout,
        partitioning,
        node.ctx.seed,
        origin.epoch,
        shuffle=node.spec.shuffles_units,  # the deal the checkpointed epoch used (shuffle_mode)
    )
    if origin.loader is not None:
        left = _loader_left(node, origin, origin.loader, layout, plan)
        return [_sized(Piece(p.unit, p.start, p.stop), counts) for p in left if not p.pad]
    left = []
    for slot, pieces in enumerate(plan):
        if slot in origin.exhausted:
            continue
        progress = origin.slots.get(slot, (0, 0))
        if isinstance(progress, ShuffleProgress):
            if origin.shuffle is None:
                raise StateError("resume state field 'origin' has a shuffle's progress but no shuffle")
            old = _old_slot(node, origin, layout.ranks, layout.workers, slot)
            taken = progress.taken
            buffered = sorted(buffered_inputs(old, *origin.shuffle, taken, progress.emitted))
            left.extend(_not_emitted(pieces, taken, buffered))
            continue
        pos, index = progress
        if pos < len(pieces):
            current = pieces[pos]
            start = current.start + index
            if current.stop is None or start < current.stop:
                left.append(Piece(current.unit, start, current.stop, current.pad))
            left.extend(pieces[pos + 1 :])
    return [_sized(Piece(p.unit, p.start, p.stop), counts) for p in left if not p.pad]


def _sized(piece: Piece, counts: list[int] | None) -> Piece:
    if piece.stop is not None or counts is None:
        return piece
    return Piece(piece.unit, piece.start, counts[piece.unit], piece.pad)


def _old_slot(node: Replaying, origin: ElasticOrigin, ranks: int, workers: int, slot: int) -> RuntimeContext:
    """The context an old reader ran its shuffle in (its seed derives from the old slot)."""
    return RuntimeContext(
        rank=slot // workers,
        world_size=ranks,
        worker_id=slot % workers,
        num_workers=workers,
        seed=node.ctx.seed,
        epoch=origin.epoch,
    )


def _not_emitted(pieces: list[Piece], taken: int, buffered: list[int]) -> list[Piece]:
    """The samples of a stream (the pieces, sized) that were not emitted: the `buffered` input indices
    (sorted), then every input from `taken` on."""
    out: list[Piece] = []
    first = 0  # the stream index of the current piece's first sample
    b = 0
    for piece in pieces:
        size = piece.size
        while b < len(buffered) and buffered[b] < first + size:
            at = piece.start + buffered[b] - first
            out.append(Piece(piece.unit, at, at + 1, piece.pad))
            b += 1
        if first + size > taken:
            start = piece.start + max(0, taken - first)
            out.append(Piece(piece.unit, start, piece.stop, piece.pad))
        first += size
    return out


# The order in which a TorchLoader's merge hands on its workers' samples: (worker, sample within the worker's
# stream) for each worker's stream size and the workers' payload size. The loader's rule, so the loader
# registers it (`shardcache.loader.merge`), and the deal only replays it.
MergeOrder = Callable[[Sequence[int], int], Iterator[tuple[int, int]]]
_MERGE_ORDER: list[MergeOrder] = []


def register_merge_order(order: MergeOrder) -> None:
    """Make `order` the merge order `_loader_left` replays (the TorchLoader's, registered on its import)."""
    _MERGE_ORDER[:] = [order]


def _loader_left(
    node: Replaying,
    origin: ElasticOrigin,
    loader: LoaderShuffleOrigin,
    layout: Layout,
    plan: list[list[Piece]],
) -> list[Piece]:
    """What a TorchLoader with a loader-side shuffle had not emitted, rank by rank.

    Its workers' payloads (batches of `batch` samples, the last one smaller) reach the main process in the
    loader's fixed order (the registered `MergeOrder`), so the n-th sample the loader-side shuffle took is
    a known sample of a known worker; the shuffle's buffer is replayed from taken/emitted as above.
    """
    if not _MERGE_ORDER:
        raise UnsupportedResume(
            "this state resumes a TorchLoader's loader-side shuffle elastically: load it through "
            "shardcache.TorchLoader (whose merge order the replay needs)"
        )
    merge_order = _MERGE_ORDER[0]
    batch, workers = loader.batch, layout.workers
    left: list[Piece] = []
    for rank in range(layout.ranks):
        progress = loader.ranks[rank]
        taken = progress.taken
        old = _old_slot(node, origin, layout.ranks, 1, rank)
        buffered = set(buffered_inputs(old, *loader.shuffle, taken, progress.emitted))
        streams = [plan[rank * workers + w] for w in range(workers)]
        sizes = [sum(p.size for p in stream) for stream in streams]
        frontier = [0] * workers  # samples of each worker among the first `taken` the shuffle took
        held: list[list[int]] = [[] for _ in range(workers)]
        for flat, (w, j) in enumerate(itertools.islice(merge_order(sizes, batch), taken)):
            if flat in buffered:
                held[w].append(j)
            frontier[w] = j + 1
        for w, stream in enumerate(streams):
            left.extend(_not_emitted(stream, frontier[w], held[w]))
    return left
