"""One slot's pass over a pipeline: `start` (resume point, nodes, iterator) and `PipelineIterator` (its
resume state, skip count and telemetry)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.daemon_access.telemetry import Telemetry, count_items, for_reader, timed_items
from shardcache.pipeline.build import build
from shardcache.pipeline.spec import PipelineSpec
from shardcache.resume.point import resume_point
from shardcache.resume.state import STATE_VERSION, DatasetState
from shardcache.sources import SourceSpec
from shardcache.sources.base import source_below
from shardcache.sources.schedule import source_job
from shardcache.stages import Node


def close_all(*closers: Callable[[], None] | None) -> None:
    """Run every closer in order (None: nothing to close), each even when an earlier one raised; the first
    error propagates once all ran. How an iterator's finalizer releases nodes, telemetry and watchdog."""
    first: BaseException | None = None
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the other closers ran
            if first is None:
                first = exc
    if first is not None:
        raise first


def close_telemetry(telemetry: Telemetry | None) -> Callable[[], None] | None:
    """The closer of `telemetry`: its reporting thread sends the last figures without being waited for."""
    return None if telemetry is None else functools.partial(telemetry.close, wait=False)


class PipelineIterator:
    """Iterates one slot's pipeline; `state_dict()` is the position before the next item."""

    def __init__(
        self, node: Node, ctx: RuntimeContext, fingerprint: str, parts: list[str] | None = None
    ) -> None:
        self.node = node
        self.context = ctx
        self.fingerprint = fingerprint
        self.parts = parts or []  # short per-stage descriptions: a refusal names what differs
        self.source = source_below(node)
        self._next = node.__next__
        self.telemetry: Telemetry | None = None
        # Node generators reference their nodes (a cycle the garbage collector would free at some later
        # time); closing when this acyclic object is released closes shards and deletes daemon plans at once.
        self._finalizer = weakref.finalize(self, node.close)

    def report_to_daemon(self, spec: SourceSpec, batched: bool) -> None:
        """Report wait time, samples and skipped shards of this iteration to the daemon (`telemetry`).

        `batched`: items are batches (count their samples); otherwise each item is one sample.
        """
        source = self.source
        telemetry = for_reader(
            spec.daemon,
            source_job(spec.hints.job, spec.shards, self.context.seed),
            self.context.slot,
            lambda: 0 if source is None else source.skipped_shards,
        )
        if telemetry is None:
            return
        self.telemetry = telemetry
        self._next = timed_items(self.node.__next__, telemetry, count_items if batched else None).__next__
        telemetry.start()  # the trainer's own process: no DataLoader forks after this
        # The finalizer must not hold the iterator: it closes the node and this telemetry, by reference.
        self._finalizer.detach()
        closers = (self.node.close, close_telemetry(telemetry))
        self._finalizer = weakref.finalize(self, functools.partial(close_all, *closers))

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> Any:
        return self._next()

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state (`shardcache.resume.state.DatasetState`)."""
        state: DatasetState = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "stages": self.parts,
            "slot": self.context.slot,
            "total_slots": self.context.total_slots,
            "epoch": self.context.epoch,
            "pipeline": self.node.state_dict(),
            # A count, not a position: how TorchLoader's workers report skips to the main process.
            "skipped_shards": self.skipped_shards,
        }
        return dict(state)

    @property
    def skipped_shards(self) -> int:
        """Shards skipped so far under `on_error="skip"` / `on_corrupt="skip"` (kept across a resume)."""
        return 0 if self.source is None else self.source.skipped_shards

    def close(self) -> None:
        """Close open shards and delete this slot's daemon plans."""
        self._finalizer()


def start(spec: PipelineSpec, ctx: RuntimeContext, pending: dict[str, Any] | None) -> PipelineIterator:
    """Begin the pass of the slot `ctx` names over `spec`, from the loaded state `pending` (None: from the
    start of `ctx`'s epoch; a state sets the epoch it was taken in)."""
    spec.facts.capture()
    resume = resume_point(spec, pending, ctx)
    if resume is not None:
        ctx = ctx.with_epoch(resume.epoch)
    node = build(spec, ctx)
    if resume is not None:
        resume.restore(node)
    iterator = PipelineIterator(node, ctx, spec.fingerprint(), spec.parts())
    if resume is not None:
        resume.carry_over(iterator.source)
    return iterator
