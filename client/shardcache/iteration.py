"""`PipelineIterator`: one slot's pass over a Dataset, its resume state, skip count and telemetry."""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

from shardcache.context import RuntimeContext
from shardcache.sources import SourceNode, SourceSpec
from shardcache.stages import Node

if TYPE_CHECKING:
    from shardcache.daemon_access.telemetry import Telemetry

STATE_VERSION = 1


def _close_all(node: Node, telemetry: Telemetry | None) -> None:
    try:
        node.close()
    finally:
        if telemetry is not None:
            telemetry.close(wait=False)  # the reporting thread sends the last figures


def _source_of(node: Node) -> SourceNode | None:
    """The source node at the bottom of a stage chain (None for a mix, whose sources come and go)."""
    seen: Node | None = node
    while seen is not None and not isinstance(seen, SourceNode):
        seen = getattr(seen, "up", None)
    return seen


class PipelineIterator:
    """Iterates one slot's pipeline; `state_dict()` is the position before the next item."""

    def __init__(
        self, node: Node, ctx: RuntimeContext, fingerprint: str, parts: list[str] | None = None
    ) -> None:
        self.node = node
        self.context = ctx
        self.fingerprint = fingerprint
        self.parts = parts or []  # short per-stage descriptions: a refusal names what differs
        self._source = _source_of(node)
        self._next = node.__next__
        self.telemetry: Telemetry | None = None
        # Node generators reference their nodes (a cycle the garbage collector would free at some later
        # time); closing when this acyclic object is released closes shards and deletes daemon plans at once.
        self._finalizer = weakref.finalize(self, node.close)

    def report_to_daemon(self, spec: SourceSpec, batched: bool) -> None:
        """Report wait time, samples and skipped shards of this iteration to the daemon (`telemetry`).

        `batched`: items are batches (count their samples); otherwise each item is one sample.
        """
        from shardcache.daemon_access.telemetry import count_items, for_reader, timed_items
        from shardcache.sources.schedule import job_id

        job = spec.options.get("job") or job_id([r.url for r in spec.shards], self.context.seed)
        source = self._source
        telemetry = for_reader(
            spec.daemon, job, self.context.slot, lambda: 0 if source is None else source.skipped_shards
        )
        if telemetry is None:
            return
        self.telemetry = telemetry
        self._next = timed_items(self.node.__next__, telemetry, count_items if batched else None).__next__
        telemetry.start()  # the trainer's own process: no DataLoader forks after this
        # The finalizer must not hold the iterator: it closes the node and this telemetry, by reference.
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, functools.partial(_close_all, self.node, telemetry))

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> Any:
        return self._next()

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state: version, pipeline fingerprint, slot layout, epoch, positions."""
        return {
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

    @property
    def skipped_shards(self) -> int:
        """Shards skipped so far under `on_error="skip"` / `on_corrupt="skip"` (kept across a resume)."""
        return 0 if self._source is None else self._source.skipped_shards

    def close(self) -> None:
        """Close open shards and delete this slot's daemon plans."""
        self._finalizer()
