"""A TorchLoader's resume state: its identity, the checks, and where the workers start again.

A loader's state (`LoaderState`: `header`, then every node's position) names what it was taken from: a
fingerprint and short descriptions (`LoaderShape.parts`) of the dataset, the worker-side batching and the
loader-side stages, the number of workers and the data-parallel layout. `check_loaded` refuses a
state the loader cannot resume from; `resume_start` turns the loaded state into the loader's own state
and the workers' start states, for an elastic resume from merged states too
(positions and origins: `shardcache.resume.elastic`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.errors import StateError, UnsupportedResume
from shardcache.formatting import callable_name
from shardcache.loader.merge import MergeNode
from shardcache.node import Node, field, state_of
from shardcache.resume.check import spec_parts
from shardcache.resume.elastic import (
    check_merged,
    elastic_state,
    is_merged,
    merged_ranks,
    origin_of,
    source_position,
)
from shardcache.resume.state import (
    IDENTITY_KEYS,
    STATE_VERSION,
    ElasticState,
    Envelope,
    Flat,
    LoaderHeader,
    check_fingerprint,
    check_identity,
    check_seed,
    check_version,
    initial,
    unwrap,
)
from shardcache.sources.deal.order import LEGACY_ORDER_VERSION, ORDER_KEY, ORDER_VERSION
from shardcache.sources.deal.partition import Layout, Partitioning
from shardcache.sources.deal.pieces import (
    ElasticOrigin,
    LoaderShuffleOrigin,
    OriginState,
    ShuffleProgress,
    needs_counts,
)
from shardcache.spec import PipelineSpec
from shardcache.stages import Stage
from shardcache.stages.shuffle import ShuffleNode, ShuffleStage


@dataclass(frozen=True)
class LoaderShape:
    """What a TorchLoader's states identify it by: the dataset's pipeline, the worker-side batching and the
    loader-side stages (the TorchLoader makes one; nothing here holds the loader itself)."""

    dataset: PipelineSpec
    num_workers: int
    batch_size: int | None
    collate_fn: Callable[[list[Any]], Any] | None
    drop_last: bool
    stages: tuple[Stage, ...]

    def _collate_name(self) -> str | None:
        return None if self.collate_fn is None else callable_name(self.collate_fn)

    def fingerprint(self, num_workers: int | None = None) -> str:
        """A stable hash of the dataset, the worker-side batching (with `num_workers`, by default the
        loader's) and the loader's stages."""
        workers = self.num_workers if num_workers is None else num_workers
        parts = [
            self.dataset.fingerprint(),
            f"workers={workers} batch={self.batch_size} collate={self._collate_name()} "
            f"drop_last={self.drop_last}",
            *(stage.describe() for stage in self.stages),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]

    def parts(self, num_workers: int | None = None) -> list[str]:
        """Short descriptions of the dataset, the loader's batching and its stages (`resume.check`)."""
        workers = self.num_workers if num_workers is None else num_workers
        return [
            *spec_parts(self.dataset),
            f"loader({workers},{self.batch_size},{self._collate_name()},{self.drop_last})",
            *(stage.describe() for stage in self.stages),
        ]


def header(shape: LoaderShape, ctx: RuntimeContext, origin: OriginState | None = None) -> LoaderHeader:
    """What a state of the loader's iteration as `ctx` starts with, before the nodes' positions (`origin`:
    where an elastic resume started this epoch); `LoaderState` less its ``pipeline``."""
    return {
        "version": STATE_VERSION,
        "kind": "torch_loader",
        "fingerprint": shape.fingerprint(),
        "stages": shape.parts(),
        "seed": ctx.seed,
        "num_workers": shape.num_workers,
        "dp_rank": ctx.dp_rank,
        "dp_size": ctx.dp_size,
        "node_groups": ctx.node_groups,
        "epoch": ctx.epoch,
        # What an elastic resume through a loader-side shuffle needs to replay this epoch's plan.
        "partitioning": shape.dataset.partitioning_of(ctx),
        "order": ORDER_VERSION,  # ORDER_KEY: the epoch order that plan is dealt in (`sources.deal.order`)
        "origin": origin,
    }


def initial_state(shape: LoaderShape, ctx: RuntimeContext) -> Envelope:
    """The envelope of a loader that has not begun (``state`` None): its identity alone."""
    own = {key: value for key, value in header(shape, ctx).items() if key in IDENTITY_KEYS}
    return initial(own, ctx.identity())


def check_loaded(shape: LoaderShape, blob: object, ctx: RuntimeContext) -> Flat | None:
    """Refuse a state `TorchLoader.load_state_dict` cannot take (`ctx`: the loader's context now), in an
    envelope or version 1's flat layout. Returns the flat layout, None to start from the beginning."""
    loaded = unwrap(blob, "TorchLoader resume state")
    state = loaded.flat
    if is_merged(state):
        if state.get("of") != "torch_loader":
            raise StateError(
                "a merged Dataset state loads with Dataset.load_state_dict, not TorchLoader",
                code="ResumeIdentityMismatch",
            )
        # An elastic resume may change num_workers: the rest of the loader must be the same.
        saved = (merged_ranks(state) or [state])[0]
        workers = saved.get("num_workers", shape.num_workers)
        if not isinstance(workers, int):
            raise StateError(
                f"TorchLoader resume state field 'num_workers'={workers!r} must be an integer",
                code="InvalidResumeState",
            )
        check_merged(state, shape.fingerprint(workers), shape.parts(workers))
        if loaded.fresh:
            return None
        current = initial_state(shape, ctx)["identity"]
        # The views name the loader's worker count, which an elastic resume may change.
        check_identity(loaded.identity, {**current, "loader": (loaded.identity or {}).get("loader")})
        return state
    check_state(shape, state, ctx, fresh=loaded.fresh)
    check_identity(loaded.identity, initial_state(shape, ctx)["identity"])
    return None if loaded.fresh else state


def check_state(shape: LoaderShape, state: object, ctx: RuntimeContext, fresh: bool = False) -> None:
    """Refuse a loader's own state of another kind, version, layout or pipeline, or a truncated one
    (`fresh`: an envelope whose ``state`` is None, which has only its identity to check)."""
    if not isinstance(state, dict) or state.get("kind") != "torch_loader":
        raise StateError(
            "resume state was not taken from a TorchLoader (use Dataset.load_state_dict)",
            code="ResumeIdentityMismatch",
        )
    check_version(state, "TorchLoader resume state")
    check_seed(state, ctx.seed)
    if state.get("num_workers") != shape.num_workers:
        raise StateError(
            f"resume state was taken with num_workers={state.get('num_workers')}, this TorchLoader has "
            f"num_workers={shape.num_workers}; resume with the same number of workers",
            code="ResumeIdentityMismatch",
        )
    if state.get("dp_size") != ctx.dp_size:
        raise StateError(
            f"resume state is for data-parallel rank {state.get('dp_rank')} of {state.get('dp_size')}, "
            f"this loader is rank {ctx.dp_rank} of {ctx.dp_size}: a rank's own state resumes the same world "
            "size; for another one, load shardcache.merge_states of every rank's state",
            code="ResumeIdentityMismatch",
        )
    if state.get("dp_rank") != ctx.dp_rank:
        raise StateError(
            f"resume state is rank {state.get('dp_rank')}'s own (of {state.get('dp_size')}) and this loader "
            f"is rank {ctx.dp_rank}: a rank's state resumes that rank only. A framework that saves rank 0's "
            "state for every rank (Lightning, Accelerate's save_state) needs a job-wide state: "
            "TorchLoader(..., state_scope='job') gathers every rank's position on save "
            "(shardcache.lightning.ShardcacheCallback sets it up for Lightning; docs/frameworks.md), or "
            "load shardcache.merge_states of every rank's state",
            code="ResumeIdentityMismatch",
        )
    check_fingerprint(
        state,
        shape.fingerprint(),
        shape.parts(),
        "resume state was taken from a TorchLoader with another dataset, batching or stage list",
    )
    if not fresh and (not isinstance(state.get("epoch"), int) or not isinstance(state.get("pipeline"), dict)):
        raise StateError(
            "TorchLoader resume state lacks 'epoch' or 'pipeline'; it is truncated", code="InvalidResumeState"
        )


def items_before(pending: Flat | None) -> int | None:
    """The items of the epoch a loader's own state had yielded (0 with no state: a pass from the start;
    None when the state does not say, as those taken before it was recorded)."""
    if pending is None:
        return 0
    items = pending.get("items")
    return items if isinstance(items, int) and not isinstance(items, bool) and items >= 0 else None


def resume_start(
    shape: LoaderShape, pending: Flat | None, ctx: RuntimeContext
) -> tuple[Flat | None, dict[int, ElasticState], RuntimeContext]:
    """Where the loader's iteration as `ctx` starts: its own checked state (None: none, or an elastic
    resume), the workers' start states, and the context with the saved epoch."""
    worker_states: dict[int, ElasticState] = {}
    if pending is not None and pending.get("kind") == "merged":
        pending, worker_states, epoch = _from_merged(shape, pending, ctx)
        ctx = ctx.with_epoch(epoch)
    if pending is not None:
        check_state(shape, pending, ctx)
        ctx = ctx.with_epoch(field(pending, "epoch", int))
    return pending, worker_states, ctx


def _from_merged(
    shape: LoaderShape, merged: Flat, ctx: RuntimeContext
) -> tuple[Flat | None, dict[int, ElasticState], int]:
    """This rank's own state when the layout is unchanged; else every worker's elastic start state."""
    states = merged_ranks(merged)
    epoch = field(merged, "epoch", int)
    first = states[0]
    unchanged = (first.get("dp_size"), first.get("num_workers"), first.get("node_groups")) == (
        ctx.dp_size,
        shape.num_workers,
        ctx.node_groups,
    )
    if unchanged:
        return states[ctx.dp_rank], {}, epoch
    if any(isinstance(stage, ShuffleStage) for stage in shape.stages):
        origin = _loader_shuffle_origin(shape, merged)
    else:
        entries: list[tuple[int, Mapping[str, object] | None, bool]] = []
        for state in states:
            merge = state_of(state, "pipeline")
            for stage in reversed(shape.stages):
                if not stage.passes_position:  # the loader's own: map, batch (it has no select)
                    raise UnsupportedResume(
                        "an elastic resume (another number of nodes, ranks or workers) cannot go through "
                        f"the loader-side .{stage.describe()}: it holds items back. Resume on the same "
                        "topology with each rank's own state, or keep map, batch and one shuffle (after "
                        "an unbatch) on the loader"
                    )
                merge = Node.state_below(merge)
            streams = max(1, field(state, "num_workers", int))
            done = MergeNode.exhausted_workers(merge)
            workers = MergeNode.worker_states(merge)
            for w in range(streams):
                slot = field(state, "dp_rank", int) * streams + w
                worker = workers.get(w)
                stages = shape.dataset.stages
                position = None if worker is None else source_position(stages, state_of(worker, "pipeline"))
                entries.append((slot, position, w in done))
        origin = origin_of(entries, epoch, shape.dataset.stages)
    if needs_counts(origin):  # here in the main process: the workers get the counts with the dataset
        shape.dataset.count_samples(ctx, always=True)
    start = elastic_state(shape.dataset.fingerprint(), origin)
    return None, {w: start for w in range(max(1, shape.num_workers))}, epoch


def _loader_shuffle_origin(shape: LoaderShape, merged: Flat) -> ElasticOrigin:
    """The origin of an elastic resume through a loader-side shuffle (`sources.deal.pieces._loader_left`):
    each old rank's shuffle progress, with the layout and partitioning its header recorded."""

    def refuse(why: str) -> UnsupportedResume:
        return UnsupportedResume(
            f"an elastic resume through the loader-side shuffle needs {why}; resume on the same topology "
            "with each rank's own state"
        )

    stages = list(shape.stages)
    at = next(i for i, s in enumerate(stages) if isinstance(s, ShuffleStage))
    shuffle = stages[at]
    assert isinstance(shuffle, ShuffleStage)
    below = [s.batches for s in stages[:at] if not s.one_to_one]  # besides maps: one unbatch, if batched
    if below != ([False] if shape.batch_size is not None else []) or any(
        not s.passes_position for s in stages[at + 1 :]
    ):
        raise refuse("the workers' batches unbatched right before it and only map or batch after it")
    if any(not s.one_to_one for s in shape.dataset.stages):
        raise refuse("only map and select in the dataset (one sample per input)")
    if shape.drop_last:
        raise refuse("drop_last=False for the workers' batches")
    ranks: dict[int, ShuffleProgress] = {}
    states = merged_ranks(merged)
    first = states[0]
    if first.get("partitioning") is None:
        raise refuse("a state taken by this version (it records the partitioning)")
    for state in states:
        node = state_of(state, "pipeline")
        for _ in stages[at + 1 :]:  # map and batch after the shuffle: their state is the shuffle's
            node = Node.state_below(node)
        ranks[field(state, "dp_rank", int)] = ShuffleProgress(*ShuffleNode.progress(node))
    nested = first.get("origin")
    groups, size, workers = (field(first, key, int) for key in ("node_groups", "dp_size", "num_workers"))
    return ElasticOrigin(
        epoch=field(merged, "epoch", int),
        layout=Layout(groups, size, max(1, workers)),
        partitioning=Partitioning(*field(first, "partitioning", list)),
        slots={},
        exhausted=frozenset(),
        origin=None if nested is None else ElasticOrigin.of(field(first, "origin", dict)),
        order_version=first.get(ORDER_KEY, LEGACY_ORDER_VERSION),
        shuffle=None,
        loader=LoaderShuffleOrigin(
            shape.batch_size or 1, (shuffle.buffer_size, shuffle.initial, shuffle.seed), ranks
        ),
    )
