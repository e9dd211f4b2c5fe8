"""A Dataset's resume state: the mutable runtime behind the facade, the checks, and where to start.

A state is either this reader's own `PipelineIterator.state_dict()` (version, fingerprint, slot, epoch,
every node's position) or the states of every rank merged by `shardcache.merge_states`, which resumes on
any layout (`shardcache.elastic`: this reader's own state when the layout is unchanged, else the origin
of an elastic resume). `Dataset.load_state_dict` checks it with `check_loaded`; the next iteration turns
it into a `ResumePoint` (`resume_point`), which sets the epoch and restores the nodes it builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardcache.errors import StateError, UnsupportedResume
from shardcache.iteration import STATE_VERSION, PipelineIterator, _source_of
from shardcache.sources.counting import RunFacts

if TYPE_CHECKING:
    from shardcache.context import RuntimeContext
    from shardcache.dataset import Dataset
    from shardcache.stages import Node


class Runtime:
    """The mutable side of a Dataset: the epoch set by `set_epoch`, the latest iterator, a state to resume."""

    __slots__ = ("epoch", "facts", "iterator", "pending")

    def __init__(self, epoch: int | None = None, facts: RunFacts | None = None) -> None:
        self.epoch = epoch
        self.facts = facts if facts is not None else RunFacts()
        self.iterator: PipelineIterator | None = None
        self.pending: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A pickled Dataset (DataLoader workers) carries its epoch, pending state and the main process's
        # run facts (sample counts, torch.distributed), not a live iterator.
        return {"epoch": self.epoch, "pending": self.pending, "facts": self.facts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.epoch, self.pending, self.iterator = state["epoch"], state["pending"], None
        self.facts = state.get("facts") or RunFacts()

    def state_dict(self) -> dict[str, Any]:
        """The state of the most recent iterator (or the state loaded and not yet used)."""
        if self.iterator is not None:
            return self.iterator.state_dict()
        if self.pending is not None:
            return self.pending
        raise StateError("state_dict(): this dataset has not been iterated yet; iterate it first")


def check_loaded(dataset: Dataset, state: dict[str, Any]) -> None:
    """Refuse a state `dataset` cannot resume from: its own kind, or a merged one (`shardcache.elastic`)."""
    from shardcache.elastic import check_merged, is_merged

    if is_merged(state):
        check_merged(state, dataset.fingerprint(), dataset.parts())
    else:
        check_state(dataset, state, None)


def check_state(dataset: Dataset, state: Any, ctx: RuntimeContext | None) -> None:
    """Refuse a reader's own state of another version or pipeline, or (with `ctx`) for another slot."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise StateError(f"resume state version {version!r} is not supported (expected {STATE_VERSION})")
    if state.get("fingerprint") != dataset.fingerprint():
        from shardcache.resume_check import mismatch_message

        raise StateError(
            "resume state was taken from a pipeline with another source or stage list: "
            f"{mismatch_message(state, dataset.parts())} "
            f"(fingerprint {state.get('fingerprint')} != {dataset.fingerprint()})"
        )
    if ctx is not None and (state.get("slot"), state.get("total_slots")) != (ctx.slot, ctx.total_slots):
        raise StateError(
            f"resume state is for slot {state.get('slot')} of {state.get('total_slots')}, this reader is "
            f"slot {ctx.slot} of {ctx.total_slots}; resume with the same ranks and workers"
        )


class ResumePoint:
    """Where one iteration starts: this reader's own checked `state`, or an elastic resume's `origin`."""

    def __init__(self, state: dict[str, Any] | None, origin: dict[str, Any] | None) -> None:
        self.state = state
        self.origin = origin

    @property
    def epoch(self) -> int:
        """The epoch the saved pass was in."""
        return int((self.state if self.state is not None else self.origin or {})["epoch"])

    def restore(self, node: Node) -> None:
        """Put the freshly built `node` chain where the state left it (or its source at the origin)."""
        if self.state is not None:
            node.load_state_dict(self.state["pipeline"])
            return
        source = _source_of(node)
        if source is None:
            raise UnsupportedResume("an elastic resume needs a pipeline over one source (not a mix)")
        source.origin = self.origin

    def carry_over(self, iterator: PipelineIterator) -> None:
        """Go on counting the shards skipped before the state was taken."""
        if self.state is not None and iterator._source is not None:
            skipped = self.state.get("skipped_shards", 0)
            iterator._source.skipped_shards = skipped if isinstance(skipped, int) else 0


def resume_point(dataset: Dataset, pending: dict[str, Any] | None, ctx: RuntimeContext) -> ResumePoint | None:
    """The checked start of the iteration `ctx` runs from the loaded state `pending` (None: from scratch)."""
    if pending is None:
        return None
    origin = None
    from shardcache.elastic import is_merged, own_or_origin

    if is_merged(pending):
        pending, origin = own_or_origin(dataset, pending, ctx)
    if pending is not None:
        check_state(dataset, pending, ctx)
    elif origin is None:
        return None
    return ResumePoint(pending, origin)
