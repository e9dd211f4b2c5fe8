"""Where a Dataset's iteration starts from a loaded state: the checks, and the `ResumePoint`.

A state is either this reader's own `PipelineIterator.state_dict()` (`DatasetState` in its envelope) or the
states of every rank merged by `shardcache.merge_states`, which resumes on any layout
(`shardcache.resume.elastic`: this reader's own state when the layout is unchanged, else the origin of an
elastic resume). `Dataset.load_state_dict` checks it with `check_loaded`, which keeps its flat layout (None
where the envelope's ``state`` is None: the pass starts from the beginning); the next iteration turns that
into a `ResumePoint` (`resume_point`), which sets the epoch and restores the nodes it builds.
"""

from __future__ import annotations

from shardcache.context import RuntimeContext
from shardcache.errors import StateError, UnsupportedResume
from shardcache.node import Node, field, state_of
from shardcache.resume.check import spec_parts
from shardcache.resume.elastic import check_merged, is_merged, merged_ranks, own_or_origin
from shardcache.resume.state import (
    Envelope,
    Flat,
    check_fingerprint,
    check_identity,
    check_seed,
    check_version,
    initial,
    unwrap,
)
from shardcache.sources.base import SourceNode, source_below, unit_position
from shardcache.sources.deal.order import check_order_version
from shardcache.sources.deal.pieces import ElasticOrigin
from shardcache.spec import PipelineSpec
from shardcache.stages.assemble import AssembleNode, AssembleStage, check_assembler_identity


def initial_state(spec: PipelineSpec, ctx: RuntimeContext) -> Envelope:
    """The envelope of a reader of `spec` as `ctx` that has not begun (``state`` None)."""
    return initial({"fingerprint": spec.fingerprint(), "stages": spec_parts(spec)}, ctx.identity())


def check_loaded(spec: PipelineSpec, blob: object, ctx: RuntimeContext) -> Flat | None:
    """Refuse a state `spec` (read as `ctx`) cannot resume from: its own kind, or a merged one
    (`resume.elastic`), in an envelope or version 1's flat layout. Returns the flat layout to resume from,
    None to start from the beginning."""
    loaded = unwrap(blob, "resume state")
    state = loaded.flat
    if is_merged(state):
        check_merged(state, spec.fingerprint(), spec_parts(spec))
    else:
        check_state(spec, state, None)
    check_identity(loaded.identity, initial_state(spec, ctx)["identity"])
    if not loaded.fresh:
        for own in merged_ranks(state) if is_merged(state) else [state]:
            check_source_order(own)
    if not loaded.fresh and not is_merged(state):
        check_assemblers(spec, state, ctx)
    if spec.source.context is not None:
        # An explicit context is the one iterations use (unless iter_context names another): refuse
        # another seed now, as mvp-dataset does; an inferred one is checked when the iteration starts.
        check_seed(state, ctx.seed)
    return None if loaded.fresh else state


def check_source_order(state: object) -> None:
    """Refuse, when it loads, a reader's state whose source position was taken in another version of the
    epoch order (`sources.deal.order.check_order_version`); the source checks it again when it resumes."""
    node_state: object = state.get("pipeline") if isinstance(state, dict) else None
    while isinstance(node_state, dict) and isinstance(node_state.get("up"), dict):
        node_state = Node.state_below(node_state)
    if isinstance(node_state, dict) and unit_position(node_state) is not None:
        check_order_version(node_state)


def check_assemblers(spec: PipelineSpec, state: Flat, ctx: RuntimeContext) -> None:
    """Refuse, when a state loads, an assembler answering another `identity()` than the one the state
    recorded (mvp-dataset refuses it there): build one assembler per such stage and ask it."""
    node_state: object = state.get("pipeline")
    for stage in reversed(spec.stages):
        if not isinstance(node_state, dict):
            return
        if isinstance(stage, AssembleStage):
            saved = AssembleNode.recorded_identity(node_state)
            if saved is not None:
                check_assembler_identity(saved, stage.factory(ctx))
        try:
            node_state = Node.state_below(node_state)
        except StateError:
            return  # a stage whose state holds no "up" (the walk ends; the stage checks itself later)


def check_state(spec: PipelineSpec, state: object, ctx: RuntimeContext | None) -> None:
    """Refuse a reader's own state of another version or pipeline, or (with `ctx`) for another slot."""
    if not isinstance(state, dict):
        raise StateError(
            f"resume state {state!r} is not a state dict; pass what state_dict() returned",
            code="InvalidResumeState",
        )
    check_version(state, "resume state")
    check_fingerprint(
        state,
        spec.fingerprint(),
        spec_parts(spec),
        "resume state was taken from a pipeline with another source or stage list",
    )
    if ctx is not None:
        check_seed(state, ctx.seed)
    if ctx is not None and (state.get("slot"), state.get("total_slots")) != (ctx.slot, ctx.total_slots):
        raise StateError(
            f"resume state is for slot {state.get('slot')} of {state.get('total_slots')}, this reader is "
            f"slot {ctx.slot} of {ctx.total_slots}; resume with the same ranks and workers",
            code="ResumeIdentityMismatch",
        )


class ResumePoint:
    """Where one iteration starts: this reader's own checked `state`, or an elastic resume's `origin`."""

    def __init__(self, state: Flat | None, origin: ElasticOrigin | None) -> None:
        self.state = state
        self.origin = origin

    @property
    def epoch(self) -> int:
        """The epoch the saved pass was in."""
        if self.state is not None:
            return field(self.state, "epoch", int)
        assert self.origin is not None, "a resume point has a state or an origin"
        return self.origin.epoch

    def restore(self, node: Node) -> None:
        """Put the freshly built `node` chain where the state left it (or its source at the origin)."""
        if self.state is not None:
            node.load_state_dict(state_of(self.state, "pipeline"))
            return
        source = source_below(node)
        if source is None:
            raise UnsupportedResume("an elastic resume needs a pipeline over one source (not a mix)")
        source.origin = self.origin

    def carry_over(self, source: SourceNode | None) -> None:
        """Go on counting, in `source`, the shards skipped before the state was taken."""
        if self.state is not None and source is not None:
            skipped = self.state.get("skipped_shards", 0)
            source.skipped_shards = skipped if isinstance(skipped, int) else 0


def resume_point(spec: PipelineSpec, pending: Flat | None, ctx: RuntimeContext) -> ResumePoint | None:
    """The checked start of the iteration `ctx` runs from the loaded state `pending` (None: from scratch)."""
    if pending is None:
        return None
    origin = None
    if is_merged(pending):
        pending, origin = own_or_origin(spec, pending, ctx)
    if pending is not None:
        check_state(spec, pending, ctx)
    elif origin is None:
        return None
    return ResumePoint(pending, origin)
