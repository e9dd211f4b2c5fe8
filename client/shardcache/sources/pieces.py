"""The piece arithmetic of an elastic resume: what an epoch planned on one layout had left, as pieces.

A checkpoint's `origin` (`shardcache.resume.elastic`: the old layout, partitioning and every old slot's
progress) is replayed here, by the source node that resumes: the old plan is recomputed with
`plan_epoch`, and each old slot's unread part — the rest of its current piece, its later pieces, and what
a shuffle still buffered (replayed from its taken/emitted counts, as the shuffle's own resume does) —
becomes the pieces the new layout plans. Pure arithmetic over pieces and plans; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from shardcache.context import RuntimeContext
from shardcache.errors import UnsupportedResume
from shardcache.sources.options import PlanHints
from shardcache.sources.order import check_order_version
from shardcache.sources.partition import Layout, Partitioning, Piece, Unit, plan_epoch
from shardcache.stages import Node
from shardcache.stages.shuffle import ShuffleStage


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


def needs_counts(origin: dict[str, Any] | None) -> bool:
    """Whether replaying `origin` (and the origins it resumed) needs every unit's sample count: an epoch
    cut with even= does, and so does a shuffle's progress (counted in samples); whole units are replayed
    by position without counting (which would read every shard of the dataset on every rank)."""
    while origin is not None:
        partitioning = origin.get("partitioning")
        if partitioning is not None and partitioning[1] is not None:
            return True
        if origin.get("loader") is not None:
            return True
        if any(isinstance(p, dict) for p in origin.get("slots", {}).values()):
            return True
        origin = origin.get("origin")
    return False


def remaining_pieces(
    node: Replaying, units: Sequence[Unit], origin: dict[str, Any], counts: list[int] | None
) -> list[Piece]:
    """What the epoch described by `origin` had left, as pieces of `units` (see `resume.elastic`)."""
    whole = [Piece(i, 0, None if counts is None else counts[i]) for i in range(len(units))]
    if origin.get("layout") is None:
        return whole
    check_order_version(origin, "elastic resume state")
    nested = origin.get("origin")
    universe = whole if nested is None else remaining_pieces(node, units, nested, counts)
    layout = Layout(**origin["layout"])
    placement, even, exchange = origin["partitioning"]
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
    if node.spec.kind == "jsonl" and placement == "global" and even is None:
        raise UnsupportedResume(
            "an elastic resume of a jsonl source read with placement='global' and even=None (each file "
            "sliced over the old slots) is not supported: build it with placement='node' or even='drop'"
        )
    plan = plan_epoch(
        universe,
        node.weights(units),
        layout,
        Partitioning(placement, even, exchange),
        node.ctx.seed,
        int(origin["epoch"]),
        shuffle=node.spec.shuffles_units,  # the deal the checkpointed epoch used (shuffle_mode)
    )
    exhausted = set(origin.get("exhausted", ()))
    left: list[Piece] = []
    for slot, pieces in enumerate(plan):
        if slot in exhausted:
            continue
        if origin.get("loader") is not None:
            continue  # read below, rank by rank
        progress = origin["slots"].get(str(slot), (0, 0))
        if isinstance(progress, dict):
            shuffle = _shuffle_node(node, origin["shuffle"], origin, layout.ranks, layout.workers, slot)
            buffered = sorted(shuffle.buffered_inputs(progress["taken"], progress["emitted"]))
            left.extend(_not_emitted(pieces, progress["taken"], buffered))
            continue
        pos, index = progress
        if pos < len(pieces):
            current = pieces[pos]
            start = current.start + index
            if current.stop is None or start < current.stop:
                left.append(Piece(current.unit, start, current.stop, current.pad))
            left.extend(pieces[pos + 1 :])
    if origin.get("loader") is not None:
        left = _loader_left(node, origin, layout, plan)
    return [_sized(Piece(p.unit, p.start, p.stop), counts) for p in left if not p.pad]


def _sized(piece: Piece, counts: list[int] | None) -> Piece:
    if piece.stop is not None or counts is None:
        return piece
    return Piece(piece.unit, piece.start, counts[piece.unit], piece.pad)


def _shuffle_node(
    node: Replaying, params: list[Any], origin: dict[str, Any], ranks: int, workers: int, slot: int
) -> Any:
    """An old reader's shuffle, rebuilt to replay its buffer (its seed derives from the old slot)."""
    buffer_size, initial, seed = params
    old = RuntimeContext(
        rank=slot // workers,
        world_size=ranks,
        worker_id=slot % workers,
        num_workers=workers,
        seed=node.ctx.seed,
        epoch=int(origin["epoch"]),
    )
    return ShuffleStage(buffer_size, initial, seed).node(Node(), old)


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


def _loader_left(
    node: Replaying, origin: dict[str, Any], layout: Layout, plan: list[list[Piece]]
) -> list[Piece]:
    """What a TorchLoader with a loader-side shuffle had not emitted, rank by rank.

    Its workers' payloads (batches of `batch` samples, the last one smaller) reach the main process in a
    fixed rotation (`shardcache.loader.stream`), so the n-th sample the loader-side shuffle took is a
    known sample of a known worker; the shuffle's buffer is replayed from taken/emitted as above.
    """
    loader = origin["loader"]
    batch, workers = int(loader["batch"]), layout.workers
    left: list[Piece] = []
    for rank in range(layout.ranks):
        taken, emitted = loader["ranks"][str(rank)]
        shuffle = _shuffle_node(node, loader["shuffle"], origin, layout.ranks, 1, rank)
        buffered = set(shuffle.buffered_inputs(taken, emitted))
        streams = [plan[rank * workers + w] for w in range(workers)]
        sizes = [sum(p.size for p in stream) for stream in streams]
        frontier = [0] * workers  # samples of each worker among the first `taken` the shuffle took
        held: list[list[int]] = [[] for _ in range(workers)]
        flat = 0
        round_index = 0
        while flat < taken and any(round_index * batch < size for size in sizes):
            for w, size in enumerate(sizes):
                count = min(batch, size - round_index * batch)
                for j in range(round_index * batch, round_index * batch + max(0, count)):
                    if flat >= taken:
                        break
                    if flat in buffered:
                        held[w].append(j)
                    frontier[w] = j + 1
                    flat += 1
            round_index += 1
        for w, stream in enumerate(streams):
            left.extend(_not_emitted(stream, frontier[w], held[w]))
    return left
