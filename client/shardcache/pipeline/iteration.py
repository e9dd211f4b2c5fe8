"""One slot's pass over a pipeline: `start` (resume point, nodes, iterator) and `PipelineIterator` (its
resume state, skip count, stage times and telemetry)."""

from __future__ import annotations

import functools
import itertools
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.daemon_access.item_counts import count_items
from shardcache.daemon_access.telemetry import Telemetry, for_reader, timed_items
from shardcache.errors import UnsupportedResume
from shardcache.node import Node
from shardcache.pipeline.build import build
from shardcache.pipeline.stage_times import StageClock, StageStats, StageTimes, stage_times_enabled
from shardcache.resume.check import spec_parts
from shardcache.resume.point import check_loaded, resume_point
from shardcache.resume.state import STATE_VERSION, DatasetState, Flat, StateDict, live_of, public, wrap
from shardcache.sources import SourceSpec
from shardcache.sources.base import source_below
from shardcache.sources.deal.schedule import source_job
from shardcache.spec import PipelineSpec


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
        self._batched = False  # what telemetry counts: batches' samples, or items
        self.exhausted = False  # raised StopIteration: the state is None, the next pass starts anew
        self.started = False  # yielded an item: the pass counts as its epoch's (`shardcache.epochs`)
        self._on_first: Callable[[int], None] | None = None
        self.spec: PipelineSpec | None = None  # set by `start`: what `load_state_dict` builds again
        # Set by `start` unless stage times are off; one cell the telemetry reads, a resume replaces.
        self._clocks: list[StageClock | None] = [None]
        self.began = time.perf_counter()  # the pass's wall clock, for `stats()`
        # Node generators reference their nodes (a cycle the garbage collector would free at some later
        # time); closing when this acyclic object is released closes shards and deletes daemon plans at once.
        self._finalizer = weakref.finalize(self, node.close)

    def report_to_daemon(self, spec: SourceSpec, batched: bool) -> None:
        """Report wait time, samples and skipped shards of this iteration to the daemon (`telemetry`).

        `batched`: items are batches (count their samples); otherwise each item is one sample.
        """
        source, clocks = self.source, self._clocks
        telemetry = for_reader(
            spec.daemon,
            source_job(spec.hints.job, spec.shards, self.context.seed),
            self.context.slot,
            lambda: 0 if source is None else source.skipped_shards,
            # Not `self`: the telemetry outlives this iterator in its finalizer (see `_attach`).
            stages=lambda: _times_of(clocks).as_dict(),
        )
        if telemetry is None:
            return
        self.telemetry, self._batched = telemetry, batched
        self._attach()
        telemetry.start()  # the trainer's own process: no DataLoader forks after this

    def _attach(self) -> None:
        """Read items from `node` (timed when reporting) and close it (and the telemetry) with this one."""
        telemetry = self.telemetry
        self._next = self.node.__next__
        if telemetry is not None:
            self._next = timed_items(self._next, telemetry, count_items if self._batched else None).__next__
        # The finalizer must not hold the iterator: it closes the node and this telemetry, by reference.
        self._finalizer.detach()
        closers = (self.node.close, close_telemetry(telemetry))
        self._finalizer = weakref.finalize(self, functools.partial(close_all, *closers))

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Go on from `state` instead (mvp-dataset's iterator method): what `Dataset.load_state_dict` takes,
        checked the same way; the nodes are built again at its position and the current ones closed.

        Raises:
            ResumeStateError: the state does not fit (see `Dataset.load_state_dict`).
            UnsupportedResume: an iterator not started by a Dataset.
        """
        spec = self.spec
        if spec is None:
            raise UnsupportedResume("this iterator was not started by a Dataset; load the state there")
        replacement = start(spec, self.context, check_loaded(spec, state, self.context))
        replacement._finalizer.detach()  # its node is this iterator's now
        self.node.close()
        self.node, self.context, self.source = replacement.node, replacement.context, replacement.source
        self.clock = replacement.clock
        self.exhausted = False
        self._attach()

    def __iter__(self) -> PipelineIterator:
        return self

    def pad_to_multiple(self, multiple: int) -> None:
        """End this pass with a multiple of `multiple` items, repeating its first ones (see `_padded`)."""
        if multiple > 1:
            self._next = _padded(self._next, multiple).__next__

    def on_first_item(self, callback: Callable[[int], None]) -> None:
        """Call `callback(epoch)` when this pass yields its first item (a `Dataset`'s epoch clock)."""
        self._on_first = callback

    def __next__(self) -> Any:
        try:
            item = self._next()
        except StopIteration:
            self.exhausted = True
            raise
        if not self.started:
            self.started = True
            if self._on_first is not None:
                self._on_first(self.context.epoch)
        return item

    def state_dict(self) -> StateDict:
        """The resume envelope (`shardcache.resume.state.wrap`): small and JSON-serialisable; its ``state``
        is None once this iterator is exhausted (the next pass starts from the beginning)."""
        return public(wrap(self.position(), self.context.identity(), ended=self.exhausted))

    def live_state(self) -> StateDict:
        """The position alone, without version or identity (mvp-dataset's `live_state()`)."""
        return public(live_of(self.position()))

    def position(self) -> DatasetState:
        """The flat state (`DatasetState`): what a TorchLoader's workers send with every item, and what a
        loaded state becomes (`shardcache.resume.state.unwrap`)."""
        state: DatasetState = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "stages": self.parts,
            "seed": self.context.seed,
            "slot": self.context.slot,
            "total_slots": self.context.total_slots,
            "epoch": self.context.epoch,
            "pipeline": self.node.state_dict(),
            # A count, not a position: how TorchLoader's workers report skips to the main process.
            "skipped_shards": self.skipped_shards,
        }
        return state

    @property
    def clock(self) -> StageClock | None:
        """The stage clock of this pass (None: stage times are off)."""
        return self._clocks[0]

    @clock.setter
    def clock(self, clock: StageClock | None) -> None:
        self._clocks[0] = clock

    def stage_times(self) -> StageTimes:
        """Seconds spent so far in each part of this pass (empty when stage times are off)."""
        return _times_of(self._clocks)

    def stats(self) -> StageStats:
        """Where this pass's time went; in the trainer's own process every part is time it waited."""
        times = self.stage_times()
        busy = sum(times.seconds)
        return StageStats(times, waited_s=busy, elapsed_s=time.perf_counter() - self.began, workers=0)

    @property
    def skipped_shards(self) -> int:
        """Shards skipped so far under `on_error="skip"` / `on_corrupt="skip"` (kept across a resume)."""
        return 0 if self.source is None else self.source.skipped_shards

    def close(self) -> None:
        """Close open shards and delete this slot's daemon plans."""
        self._finalizer()


def _times_of(clocks: list[StageClock | None]) -> StageTimes:
    clock = clocks[0]
    return StageTimes() if clock is None else clock.times()


def _padded(next_item: Callable[[], Any], multiple: int) -> Iterator[Any]:
    """The items of `next_item`, then as many of the first ones again as make the count a multiple of
    `multiple`. Accelerate's dispatcher joins the DataLoader workers' batches a rank's worth at a time and
    cuts the joined batch evenly: a worker's short last batch met in the middle of the stream loses samples
    without a word. Whole batches from every worker leave only repeats, as Accelerate's own `even_batches`
    makes at the end of an epoch (docs/frameworks.md)."""
    head: list[Any] = []
    count = 0
    while True:
        try:
            item = next_item()
        except StopIteration:
            break
        if len(head) < multiple - 1:
            head.append(item)
        count += 1
        yield item
    if head:
        yield from itertools.islice(itertools.cycle(head), -count % multiple)


def start(spec: PipelineSpec, ctx: RuntimeContext, pending: Flat | None) -> PipelineIterator:
    """Begin the pass of the slot `ctx` names over `spec`, from the loaded state `pending` (None: from the
    start of `ctx`'s epoch; a state sets the epoch it was taken in)."""
    spec.facts.capture()
    resume = resume_point(spec, pending, ctx)
    if resume is not None:
        ctx = ctx.with_epoch(resume.epoch)
    clock = StageClock() if stage_times_enabled() else None
    node = build(spec, ctx, clock)
    if resume is not None:
        resume.restore(node)
    iterator = PipelineIterator(node, ctx, spec.fingerprint(), spec_parts(spec))
    iterator.spec, iterator.clock = spec, clock
    if resume is not None:
        resume.carry_over(iterator.source)
    return iterator
