"""A TorchLoader's resume state: its identity, the checks, and where the workers start again.

A loader's state (`header`, then every node's position) names what it was taken from: a fingerprint and
short descriptions (`parts`) of the dataset, the worker-side batching and the loader-side stages, the
number of workers and the data-parallel layout. `check_loaded` refuses a state the loader cannot resume
from; `resume_start` turns the loaded state into the loader's own state and the workers' start states,
for an elastic resume from merged states too (positions and origins: `shardcache.elastic`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from shardcache.errors import StateError

if TYPE_CHECKING:
    from shardcache.context import RuntimeContext
    from shardcache.loader import LoaderIterator, TorchLoader

STATE_VERSION = 1


class LoaderRuntime:
    """The mutable side of a TorchLoader: the latest iterator and a state to resume."""

    __slots__ = ("iterator", "pending")

    def __init__(self) -> None:
        self.iterator: LoaderIterator | None = None
        self.pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The state of the most recent iteration (or the state loaded and not yet used)."""
        if self.iterator is not None:
            return self.iterator.state_dict()
        if self.pending is not None:
            return self.pending
        raise StateError("TorchLoader.state_dict(): this loader has not been iterated yet; iterate it first")


def _collate_name(loader: TorchLoader) -> str | None:
    from shardcache.stages.map import callable_name

    return None if loader.collate_fn is None else callable_name(loader.collate_fn)


def fingerprint(loader: TorchLoader, num_workers: int) -> str:
    """A stable hash of the dataset, the worker-side batching (with `num_workers`) and the loader's stages."""
    parts = [
        loader.dataset.fingerprint(),
        f"workers={num_workers} batch={loader.batch_size} collate={_collate_name(loader)} "
        f"drop_last={bool(loader.loader_kwargs.get('drop_last', False))}",
        *(stage.describe() for stage in loader.stages),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def parts(loader: TorchLoader, num_workers: int) -> list[str]:
    """Short descriptions of the dataset, the loader's batching and its stages (`resume_check`)."""
    drop_last = bool(loader.loader_kwargs.get("drop_last", False))
    return [
        *loader.dataset.parts(),
        f"loader({num_workers},{loader.batch_size},{_collate_name(loader)},{drop_last})",
        *(stage.describe() for stage in loader.stages),
    ]


def header(loader: TorchLoader, ctx: RuntimeContext, origin: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a state of `loader`'s iteration as `ctx` starts with, before the nodes' positions (`origin`:
    where an elastic resume started this epoch)."""
    return {
        "version": STATE_VERSION,
        "kind": "torch_loader",
        "fingerprint": loader.fingerprint(),
        "stages": parts(loader, loader.num_workers),
        "num_workers": loader.num_workers,
        "dp_rank": ctx.dp_rank,
        "dp_size": ctx.dp_size,
        "node_groups": ctx.node_groups,
        "epoch": ctx.epoch,
        # What an elastic resume through a loader-side shuffle needs to replay this epoch's plan.
        "partitioning": loader.dataset.partitioning_of(ctx),
        "origin": origin,
    }


def check_loaded(loader: TorchLoader, state: dict[str, Any]) -> None:
    """Refuse a state `loader.load_state_dict` cannot take (see `TorchLoader.load_state_dict`)."""
    from shardcache.elastic import check_merged, is_merged

    if is_merged(state):
        if state.get("of") != "torch_loader":
            raise StateError("a merged Dataset state loads with Dataset.load_state_dict, not TorchLoader")
        # An elastic resume may change num_workers: the rest of the loader must be the same.
        saved = (state.get("states") or [{}])[0]
        workers = saved.get("num_workers", loader.num_workers)
        check_merged(state, fingerprint(loader, workers), parts(loader, workers))
    else:
        check_state(loader, state, loader.dataset.resolve_context())


def check_state(loader: TorchLoader, state: Any, ctx: RuntimeContext) -> None:
    """Refuse a loader's own state of another kind, version, layout or pipeline, or a truncated one."""
    if not isinstance(state, dict) or state.get("kind") != "torch_loader":
        raise StateError("resume state was not taken from a TorchLoader (use Dataset.load_state_dict)")
    if state.get("version") != STATE_VERSION:
        raise StateError(
            f"TorchLoader resume state version {state.get('version')!r} is not supported "
            f"(expected {STATE_VERSION})"
        )
    if state.get("num_workers") != loader.num_workers:
        raise StateError(
            f"resume state was taken with num_workers={state.get('num_workers')}, this TorchLoader has "
            f"num_workers={loader.num_workers}; resume with the same number of workers"
        )
    if (state.get("dp_rank"), state.get("dp_size")) != (ctx.dp_rank, ctx.dp_size):
        raise StateError(
            f"resume state is for data-parallel rank {state.get('dp_rank')} of {state.get('dp_size')}, "
            f"this loader is rank {ctx.dp_rank} of {ctx.dp_size}; resume with the same world size"
        )
    if state.get("fingerprint") != loader.fingerprint():
        from shardcache.resume_check import mismatch_message

        raise StateError(
            "resume state was taken from a TorchLoader with another dataset, batching or stage list: "
            f"{mismatch_message(state, parts(loader, loader.num_workers))} "
            f"(fingerprint {state.get('fingerprint')} != {loader.fingerprint()})"
        )
    if not isinstance(state.get("epoch"), int) or not isinstance(state.get("pipeline"), dict):
        raise StateError("TorchLoader resume state lacks 'epoch' or 'pipeline'; it is truncated")


def resume_start(
    loader: TorchLoader, pending: dict[str, Any] | None, ctx: RuntimeContext
) -> tuple[dict[str, Any] | None, dict[int, Any], RuntimeContext]:
    """Where `loader`'s iteration as `ctx` starts: its own checked state (None: none, or an elastic
    resume), the workers' start states, and the context with the saved epoch."""
    worker_states: dict[int, Any] = {}
    if pending is not None and pending.get("kind") == "merged":
        pending, worker_states, epoch = _from_merged(loader, pending, ctx)
        ctx = ctx.with_epoch(epoch)
    if pending is not None:
        check_state(loader, pending, ctx)
        ctx = ctx.with_epoch(int(pending["epoch"]))
    return pending, worker_states, ctx


def _from_merged(
    loader: TorchLoader, merged: dict[str, Any], ctx: RuntimeContext
) -> tuple[dict[str, Any] | None, dict[int, Any], int]:
    """This rank's own state when the layout is unchanged; else every worker's elastic start state."""
    from shardcache.elastic import elastic_state, needs_counts, origin_of, source_position
    from shardcache.errors import UnsupportedResume

    states = merged["states"]
    first = states[0]
    unchanged = (first.get("dp_size"), first.get("num_workers"), first.get("node_groups")) == (
        ctx.dp_size,
        loader.num_workers,
        ctx.node_groups,
    )
    if unchanged:
        return states[ctx.dp_rank], {}, int(merged["epoch"])
    if any(stage.kind == "shuffle" for stage in loader.stages):
        origin = _loader_shuffle_origin(loader, merged)
    else:
        entries: list[tuple[int, dict[str, Any] | None, bool]] = []
        for state in states:
            merge = state["pipeline"]
            for stage in reversed(loader.stages):
                if stage.kind not in ("map", "batch"):
                    raise UnsupportedResume(
                        "an elastic resume (another number of nodes, ranks or workers) cannot go through "
                        f"the loader-side .{stage.describe()}: it holds items back. Resume on the same "
                        "topology with each rank's own state, or keep map, batch and one shuffle (after "
                        "an unbatch) on the loader"
                    )
                merge = merge["up"]
            streams = max(1, int(state["num_workers"]))
            done = set(merge.get("exhausted", ()))
            for w in range(streams):
                slot = int(state["dp_rank"]) * streams + w
                worker = merge["workers"].get(str(w))
                stages = loader.dataset.stages
                position = None if worker is None else source_position(stages, worker["pipeline"])
                entries.append((slot, position, w in done))
        origin = origin_of(entries, int(merged["epoch"]), loader.dataset.stages)
    if needs_counts(origin):  # here in the main process: the workers get the counts with the dataset
        loader.dataset.count_samples(always=True)
    start = elastic_state(loader.dataset.fingerprint(), origin)
    return None, {w: start for w in range(max(1, loader.num_workers))}, int(merged["epoch"])


def _loader_shuffle_origin(loader: TorchLoader, merged: dict[str, Any]) -> dict[str, Any]:
    """The origin of an elastic resume through a loader-side shuffle (`elastic._loader_left`): each old
    rank's shuffle progress, with the layout and partitioning its header recorded."""
    from shardcache.elastic import ONE_TO_ONE_STAGES
    from shardcache.errors import UnsupportedResume
    from shardcache.stages.shuffle import ShuffleStage

    def refuse(why: str) -> UnsupportedResume:
        return UnsupportedResume(
            f"an elastic resume through the loader-side shuffle needs {why}; resume on the same topology "
            "with each rank's own state"
        )

    stages = list(loader.stages)
    at = next(i for i, s in enumerate(stages) if s.kind == "shuffle")
    shuffle = stages[at]
    assert isinstance(shuffle, ShuffleStage)
    below = [s.kind for s in stages[:at] if s.kind != "map"]
    if below != (["unbatch"] if loader.batch_size is not None else []) or any(
        s.kind not in ("map", "batch") for s in stages[at + 1 :]
    ):
        raise refuse("the workers' batches unbatched right before it and only map or batch after it")
    if any(s.kind not in ONE_TO_ONE_STAGES for s in loader.dataset.stages):
        raise refuse("only map and select in the dataset (one sample per input)")
    if loader.loader_kwargs.get("drop_last"):
        raise refuse("drop_last=False for the workers' batches")
    ranks: dict[str, list[int]] = {}
    first = merged["states"][0]
    if first.get("partitioning") is None:
        raise refuse("a state taken by this version (it records the partitioning)")
    for state in merged["states"]:
        node = state["pipeline"]
        for _ in stages[at + 1 :]:  # map and batch after the shuffle: their state is the shuffle's
            node = node["up"]
        ranks[str(int(state["dp_rank"]))] = [int(node["taken"]), int(node["emitted"])]
    return {
        "epoch": int(merged["epoch"]),
        "layout": {
            "groups": int(first["node_groups"]),
            "ranks": int(first["dp_size"]),
            "workers": max(1, int(first["num_workers"])),
        },
        "partitioning": first["partitioning"],
        "slots": {},
        "exhausted": [],
        "origin": first.get("origin"),
        "shuffle": None,
        "loader": {
            "batch": loader.batch_size or 1,
            "shuffle": [shuffle.buffer_size, shuffle.initial, shuffle.seed],
            "ranks": ranks,
        },
    }
