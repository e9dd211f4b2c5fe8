"""Elastic resume: a checkpoint taken on one topology resumes on another, each remaining sample once.

Each rank checkpoints its own small state (`Dataset.state_dict()` or `TorchLoader.state_dict()`). To resume
on another number of nodes, ranks or workers, gather every rank's state (for example with
`torch.distributed.all_gather_object`), merge them with `merge_states`, and load the merged state on every
new rank with `load_state_dict`:

    >>> states = [None] * world_size  # doctest: +SKIP
    >>> torch.distributed.all_gather_object(states, loader.state_dict())  # doctest: +SKIP
    >>> save({"data": shardcache.merge_states(states), ...})  # doctest: +SKIP
    >>> loader.load_state_dict(checkpoint["data"])  # on any topology  # doctest: +SKIP

How it works: a source's state holds, besides its position, the layout and partitioning its epoch was
planned with (`sources.deal.partition`). From the merged positions the new readers recompute the old
plan and take what each old slot had not read yet: the rest of its current piece and its later pieces.
Those remaining pieces are then planned on the new layout with the same placement rules (node placement
keeps each piece on the new owner of its unit, `even=` cuts them equally) and the epoch continues; the next
epoch is planned normally. A resume on the same layout loads each rank's own state instead, so the order is
exactly the uninterrupted one.

What an elastic resume supports: stages after the source that map, select or batch (their state is the
source's position), and one shuffle with only map and select before it (its state holds how many samples
it took and emitted; which ones are still buffered is replayed from those numbers, the way the shuffle's
own resume does, so the new readers read them too). In a TorchLoader the same holds for the workers'
pipelines; the loader-side stages may map and batch, and the recommended `.unbatch().shuffle(n).batch(b)`
works too when the workers only map and select: the workers' batches reach the main process in a fixed
rotation, so the loader shuffle's n-th input is a known sample of a known worker (`_loader_left`). Other
stages hold samples back in ways no state records (assemble, an unbatch without that shuffle, a shuffle
after a batch): refused with `UnsupportedResume` naming the stage, resume those on the same topology.
Under `even="drop"` the resumed epoch leaves out fewer than the new world size of the remaining samples
again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardcache.context import RuntimeContext
from shardcache.errors import StateError, UnsupportedResume
from shardcache.node import Node, State, field, state_of
from shardcache.resume.state import (
    STATE_VERSION,
    ElasticState,
    Envelope,
    Flat,
    MergedState,
    StateDict,
    check_fingerprint,
    check_version,
    public,
    unwrap,
    wrap,
)
from shardcache.sources.base import unit_position
from shardcache.sources.deal.order import LEGACY_ORDER_VERSION, ORDER_KEY, ORDER_VERSION
from shardcache.sources.deal.partition import Layout, Partitioning
from shardcache.sources.deal.pieces import ElasticOrigin, ShuffleProgress
from shardcache.spec import PipelineSpec
from shardcache.stages import STAGE_SPECS, Stage
from shardcache.stages.shuffle import ShuffleNode, ShuffleStage

# The stages an elastic resume reads through, by name, for the message that refuses the others.
POSITION_STAGE_KINDS = tuple(spec.kind for spec in STAGE_SPECS if spec.passes_position)


def is_merged(state: object) -> bool:
    return isinstance(state, dict) and state.get("kind") in ("merged", "elastic")


def merge_states(states: Sequence[Mapping[str, object]]) -> StateDict:
    """One state from every rank's `state_dict()` (Dataset or TorchLoader), loadable on any topology.

    Args:
        states: One state per rank, in any order (duplicates from tensor-parallel co-members are fine);
            envelopes, or version 1's flat states.

    Returns:
        An envelope (`shardcache.resume.state.wrap`) whose ``state`` holds every rank's flat state; its
        ``state`` is None when every rank had ended its pass (the next pass starts from the beginning).

    Raises:
        StateError: states of different pipelines, epochs or kinds, or a rank missing, or a rank that had
            not begun while others had.
    """
    if not states or not all(isinstance(s, dict) for s in states):
        raise StateError(
            "merge_states(states): expected a non-empty list of state dicts, one per rank",
            code="InvalidResumeState",
        )
    loaded = [unwrap(s, "merge_states: a rank's state", keep_end=True) for s in states]
    runtime: object = loaded[0].identity.get("runtime") if loaded[0].identity else None
    seed = {"seed": runtime.get("seed")} if isinstance(runtime, dict) else None
    if any(entry.fresh and "epoch" not in entry.flat for entry in loaded):
        if all(entry.fresh and "epoch" not in entry.flat for entry in loaded):
            return public(_not_begun([entry.flat for entry in loaded], seed))
        raise StateError(
            "merge_states: some ranks had not begun iterating (their state is the initial one) while others "
            "had; take every rank's state at the same step",
            code="InvalidResumeState",
        )
    flats = [entry.flat for entry in loaded]
    merged = _merge_flat(flats)
    return public(wrap(merged, seed, ended=all(entry.fresh for entry in loaded)))


def _not_begun(flats: Sequence[Flat], runtime: object) -> Envelope:
    """The merged envelope of ranks that had not begun: nothing to resume, the pass starts anew."""
    first = flats[0]
    kind = "torch_loader" if first.get("kind") == "torch_loader" else "dataset"
    flat = {
        "kind": "merged",
        "of": kind,
        "fingerprint": first.get("fingerprint"),
        "stages": first.get("stages"),
    }
    return wrap(flat, runtime, ended=True)


def _merge_flat(states: Sequence[Flat]) -> MergedState:
    """The flat merged state (`MergedState`) of every rank's flat state."""
    loader = states[0].get("kind") == "torch_loader"
    fingerprints = {s.get("fingerprint") for s in states}
    if len(fingerprints) > 1:
        raise StateError(
            "merge_states: the states come from different pipelines "
            f"(fingerprints {sorted(map(str, fingerprints))})"
        )
    epochs = {s.get("epoch") for s in states}
    if len(epochs) > 1:
        raise StateError(
            f"merge_states: the ranks were at different epochs {sorted(map(str, epochs))}; take every rank's "
            "state at the same step"
        )
    if loader:
        if any(s.get("kind") != "torch_loader" for s in states):
            raise StateError("merge_states: mixed TorchLoader and Dataset states")
        by_rank = {field(s, "dp_rank", int): s for s in states}
        size = field(states[0], "dp_size", int)
        what = "data-parallel ranks"
    else:
        by_rank = {field(s, "slot", int): s for s in states}
        size = field(states[0], "total_slots", int)
        what = "slots (rank x worker)"
    missing = sorted(set(range(size)) - set(by_rank))
    if missing:
        raise StateError(f"merge_states: the states of {what} {missing} of {size} are missing")
    return {
        "version": STATE_VERSION,
        "kind": "merged",
        "of": "torch_loader" if loader else "dataset",
        "fingerprint": field(states[0], "fingerprint", str),
        "stages": field(states[0], "stages", list),  # what the envelope's identity shows (`identity_views`)
        "epoch": field(states[0], "epoch", int),
        "states": [by_rank[r] for r in range(size)],
    }


def check_merged(state: Flat, fingerprint: str, parts: Sequence[str]) -> None:
    """Refuse a merged state of another version or pipeline."""
    check_version(state, "merged resume state")
    ranks = merged_ranks(state) or [state]
    check_fingerprint(
        state,
        fingerprint,
        parts,
        "merged resume state was taken from a pipeline with another source or stage list",
        described=ranks[0],
    )


def merged_ranks(state: Flat) -> list[Flat]:
    """The ranks' flat states a merged state holds ([] for an elastic one, or none recorded)."""
    ranks = state.get("states")
    if ranks is None:
        return []
    if not isinstance(ranks, list) or not all(isinstance(rank, dict) for rank in ranks):
        raise StateError(
            "merged resume state field 'states' is not a list of states; pass what merge_states returned",
            code="InvalidResumeState",
        )
    return ranks


def source_position(stages: Sequence[Stage], pipeline: State) -> dict[str, object]:
    """A slot's progress through its epoch: the source's state, read through the stages.

    Position-only stages (map, select, batch) pass the source's position through. One `shuffle` stage is
    allowed when only map and select run below it (one input per sample): its state says how many inputs
    it took and emitted, and which are still in its buffer is replayed from those numbers; the result then
    carries `taken` and `emitted` beside the source's state. Other stages hold samples back in ways no
    state records: refused, naming the stage.
    """
    state = pipeline
    progress: dict[str, int] = {}
    for stage in reversed(stages):
        if isinstance(stage, ShuffleStage) and not progress:
            taken, emitted = ShuffleNode.progress(state)
            progress = {"taken": taken, "emitted": emitted}
        elif not (stage.one_to_one if progress else stage.passes_position):
            below = " below a shuffle" if progress else ""
            raise UnsupportedResume(
                f"an elastic resume (another number of nodes, ranks or workers) cannot go through "
                f".{stage.describe()}{below}: it holds samples back. Resume on the same topology with each "
                f"rank's own state, or keep only {', '.join(POSITION_STAGE_KINDS)} stages and one shuffle "
                "(with only map and select before it) after the source"
            )
        state = Node.state_below(state)
    if unit_position(state) is None:
        raise UnsupportedResume("an elastic resume needs a pipeline over one shard source (not a mix)")
    return {**state, **progress}


def origin_of(
    entries: Sequence[tuple[int, Mapping[str, object] | None, bool]], epoch: int, stages: Sequence[Stage] = ()
) -> ElasticOrigin:
    """The compact description of what an epoch had left: (slot, progress or None, exhausted)."""
    started = [state for _, state, _ in entries if state is not None]
    for state in started:
        if state.get("round", 0):
            raise UnsupportedResume(
                "an elastic resume of a resampling source (resample=True) is not supported"
            )
    first = started[0] if started else None
    shuffle = next((s for s in stages if isinstance(s, ShuffleStage)), None)
    nested = None if first is None else first.get("origin")
    return ElasticOrigin(
        epoch=epoch,
        layout=None if first is None else Layout(**field(first, "layout", dict)),
        partitioning=None if first is None else Partitioning(*field(first, "partitioning", list)),
        slots={slot: _progress(state) for slot, state, _ in entries if state is not None},
        exhausted=frozenset(slot for slot, _, done in entries if done),
        origin=None if nested is None else ElasticOrigin.of(field(first, "origin", dict)),
        # The order the old slots' positions were taken in (`sources.deal.order`; earlier states lack it).
        order_version=ORDER_VERSION if first is None else first.get(ORDER_KEY, LEGACY_ORDER_VERSION),
        # How the old slots shuffled (their buffers are replayed from taken/emitted; see source_position).
        shuffle=None if shuffle is None else (shuffle.buffer_size, shuffle.initial, shuffle.seed),
        loader=None,
    )


def _progress(state: Mapping[str, object]) -> tuple[int, int] | ShuffleProgress:
    if "taken" in state:  # a shuffle's progress, as `source_position` adds it
        return ShuffleProgress(field(state, "taken", int), field(state, "emitted", int))
    position = unit_position(state)
    assert position is not None, "source_position checked it"
    return position


def dataset_origin(spec: PipelineSpec, merged: Flat) -> ElasticOrigin:
    entries = [
        (field(s, "slot", int), source_position(spec.stages, state_of(s, "pipeline")), False)
        for s in merged_ranks(merged)
    ]
    return origin_of(entries, field(merged, "epoch", int), spec.stages)


def own_or_origin(
    spec: PipelineSpec, merged: Flat, ctx: RuntimeContext
) -> tuple[Flat | None, ElasticOrigin | None]:
    """This reader's own state when the layout is unchanged, else the origin of an elastic resume."""
    if merged["kind"] == "elastic":
        return None, ElasticOrigin.of(field(merged, "origin", dict))
    if merged.get("of") != "dataset":
        raise StateError("a merged TorchLoader state loads with TorchLoader.load_state_dict")
    states = merged_ranks(merged)
    same = len(states) == ctx.total_slots and _same_layout(spec, states[0], ctx)
    if same:
        return states[ctx.slot], None
    return None, dataset_origin(spec, merged)


def _same_layout(spec: PipelineSpec, state: Flat, ctx: RuntimeContext) -> bool:
    try:
        saved = source_position(spec.stages, state_of(state, "pipeline"))
    except UnsupportedResume:
        return state.get("total_slots") == ctx.total_slots
    return bool(
        saved.get("layout") == Layout.of(ctx).as_dict()
        and saved.get("partitioning") == spec.partitioning_of(ctx)
    )


def elastic_state(fingerprint: str, origin: ElasticOrigin) -> ElasticState:
    """A Dataset state that starts a reader of the new layout on what `origin` left."""
    origin_state = origin.as_state()
    return {"version": STATE_VERSION, "kind": "elastic", "fingerprint": fingerprint, "origin": origin_state}
