"""One pass of a TorchLoader: `LoaderIterator` (its items, telemetry, state and clean stop) and
`PlainIterator` (over a plain iterable, which has no state to save)."""

from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

from shardcache.daemon_access.telemetry import Telemetry
from shardcache.errors import StateError, UnsupportedResume
from shardcache.loader.merge import MergeNode
from shardcache.loader.watchdog import StallWatchdog
from shardcache.node import Node, State
from shardcache.pipeline.iteration import close_all, close_telemetry
from shardcache.pipeline.stage_times import StageClock, StageStats, StageTimes
from shardcache.resume.state import LoaderHeader, LoaderState, StateDict, live_of, public, wrap


class LoaderIterator:
    """One pass of a TorchLoader; `state_dict()` is the position before the next item it yields."""

    def __init__(
        self,
        node: Node,
        header: LoaderHeader | None,
        telemetry: Telemetry | None = None,
        watchdog: StallWatchdog | None = None,
        runtime: Mapping[str, object] | None = None,
        clock: StageClock | None = None,
        items: int | None = 0,
    ) -> None:
        self.node = node
        self.header = header
        self.telemetry = telemetry
        self.runtime = runtime
        self.clock = clock  # the loader-side stages' times (None: none, or stage times are off)
        self.exhausted = False  # raised StopIteration: the state is None, the next pass starts anew
        self.started = False  # yielded an item: the pass counts as its epoch's (`shardcache.epochs`)
        self.epoch = 0 if header is None else header["epoch"]
        # Items of this epoch yielded so far, those before a resume included (None: not known, after an
        # elastic resume); with the pass's `length` (`expect`), reaching it ends the pass.
        self.items = items
        self.length: int | None = None
        self._on_first: Callable[[int], None] | None = None
        self._next = node.__next__
        self.began = time.perf_counter()  # this pass's wall clock and the trainer's wait: `stats()`
        self.waited_s = 0.0
        # Positions before the latest items, for a consumer that fetches ahead of what it trained on
        # (`keep_positions`): a framework's checkpoint then names the position its step had reached. One is
        # always kept (a node's state is a few references), so an integration set up after the pass began
        # (Lightning's first prefetch comes before any hook) still finds it.
        self._before: deque[State] = deque(maxlen=1)
        # Node generators reference their node (a cycle), so an iterator dropped unfinished would otherwise
        # wait for the cyclic GC, which runs multiprocessing's queue finalizers before the DataLoader's own
        # shutdown: its workers then never see the stop message and are joined only after a 5 s timeout
        # each. Closing when this (acyclic) object is released stops the workers at once.
        closers = (None if watchdog is None else watchdog.close, node.close, close_telemetry(telemetry))
        self._finalizer = weakref.finalize(self, functools.partial(close_all, *closers))

    def __iter__(self) -> LoaderIterator:
        return self

    def on_first_item(self, callback: Callable[[int], None]) -> None:
        """Call `callback(epoch)` when this pass yields its first item (the dataset's epoch clock)."""
        self._on_first = callback

    def expect(self, length: int) -> None:
        """This pass ends after `length` items of its epoch: once it has yielded them it counts as exhausted
        (its state says the pass ended), though its consumer never asked for one more. A framework that
        knows a loader's length stops there (Lightning), and a checkpoint taken then must not resume an
        epoch with nothing left in it."""
        self.length = length
        self._check_end()

    def _check_end(self) -> None:
        if self.length is not None and self.items is not None and self.items >= self.length:
            self.exhausted = True

    def keep_positions(self, count: int) -> None:
        """Keep the positions before the latest `count` items (at least 1), for `state_dict(behind=...)`."""
        if count > (self._before.maxlen or 0):
            self._before = deque(self._before, maxlen=count)

    def __next__(self) -> Any:
        before = self.node.state_dict()
        try:
            telemetry = self.telemetry
            started = time.perf_counter()
            item = self._next()
        except StopIteration:
            self.exhausted = True
            raise
        waited = time.perf_counter() - started
        self.waited_s += waited
        if telemetry is not None:
            telemetry.record(waited, item)
        self._before.append(before)
        if self.items is not None:
            self.items += 1
            self._check_end()
        if not self.started:
            self.started = True
            if self._on_first is not None:
                self._on_first(self.epoch)
        return item

    def stats(self) -> StageStats:
        """Where this pass's time went: the workers' stage times summed, and the trainer's wait."""
        merge = merge_of(self.node)
        times = StageTimes() if merge is None else merge.stage_times()
        workers = 0 if merge is None else len(merge.worker_times)
        elapsed = time.perf_counter() - self.began
        loader = StageTimes() if self.clock is None else self.clock.times()
        return StageStats(times, waited_s=self.waited_s, elapsed_s=elapsed, workers=workers, loader=loader)

    @property
    def skipped_shards(self) -> int:
        """Shards the workers skipped under `on_error="skip"` / `on_corrupt="skip"`, as far as consumed."""
        merge = merge_of(self.node)
        return 0 if merge is None else merge.skipped_shards

    def state_dict(self, behind: int = 0) -> StateDict:
        """The resume envelope (`shardcache.resume.state.wrap`), small and JSON-serialisable: the loader's
        identity and layout, then its epoch and every node's position (None once exhausted).

        `behind`: the position before the latest `behind` items instead (a consumer fetched them ahead of
        the step it checkpoints; see `keep_positions`).
        """
        if behind <= 0:
            pipeline, ended, items = self.node.state_dict(), self.exhausted, self.items
        else:
            kept = self._before
            if len(kept) < behind:
                raise StateError(
                    f"the position {behind} item(s) back was not kept (keep_positions({behind}) before "
                    "iterating)",
                    code="InvalidResumeState",
                )
            pipeline, ended = kept[-behind], False
            items = None if self.items is None else self.items - behind
        return public(wrap(self._state(pipeline, items), self.runtime, ended=ended))

    def live_state(self) -> StateDict:
        """The position alone, without version or identity (mvp-dataset's `live_state()`)."""
        return public(live_of(self._state(self.node.state_dict(), self.items)))

    def _state(self, pipeline: State, items: int | None) -> LoaderState:
        """The loader's flat state (`LoaderState`): its header, the items of the epoch yielded before this
        position (for a pass of known length, when known), then the nodes' positions `pipeline`."""
        if self.header is None:
            raise UnsupportedResume("this TorchLoader iteration has no resume state")
        # (A cast: mypy wants every key of the TypedDict in a `**` literal, `items` too, which is optional.)
        state = cast(LoaderState, {**self.header, "pipeline": pipeline})
        if items is not None and self.length is not None:  # what a resumed pass of that length needs
            state["items"] = items
        return state

    def close(self) -> None:
        """Stop the workers and close the loader-side stages."""
        self._finalizer()


def merge_of(node: Node) -> MergeNode | None:
    """The merge of the workers' streams under a chain of loader-side stages (None for a plain iterable)."""
    seen: Any = node
    while seen is not None and not isinstance(seen, MergeNode):
        seen = getattr(seen, "up", None)
    return seen if isinstance(seen, MergeNode) else None


class PlainIterator(LoaderIterator):
    """One pass of a TorchLoader over a plain iterable: it has no state to save."""

    def state_dict(self, behind: int = 0) -> StateDict:
        raise UnsupportedResume(
            "TorchLoader dataset does not implement identity(): over a plain iterable, only a "
            "shardcache.Dataset resumes"
        )
