"""TorchLoader's resumable merge of its DataLoader workers' streams (`MergeNode`), in the main process.

The main process does not trust the order in which the DataLoader hands items over (after a resume it
starts at worker 0 again, whatever the rotation was); `MergeNode` buffers what arrives from the workers
(`shardcache.loader.stream.WorkerStream`) and yields workers in its own strict rotation, skipping exhausted
ones. So the merged position is small and exact (`MergeState`): each worker's pipeline state after the last
payload the main process consumed (items the DataLoader prefetched but nobody consumed are not counted), the
next worker in the rotation, and the exhausted workers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict

from shardcache.errors import StateError
from shardcache.loader.stream import Item
from shardcache.node import Node, State, field
from shardcache.pipeline.stage_times import StageTimes, add_times
from shardcache.sources.deal.pieces import register_merge_order


def merged_order(sizes: Sequence[int], batch: int) -> Iterator[tuple[int, int]]:
    """(worker, sample within the worker's stream) in the order `MergeNode` hands samples on, for workers
    whose streams hold `sizes` samples in payloads of `batch` (the last one smaller): one payload of each
    worker in turn, a worker whose stream has ended skipped. What an elastic resume of a loader-side
    shuffle replays (`shardcache.sources.deal.pieces`)."""
    round_index = 0
    while any(round_index * batch < size for size in sizes):
        for worker, size in enumerate(sizes):
            for j in range(round_index * batch, min(size, (round_index + 1) * batch)):
                yield worker, j
        round_index += 1


register_merge_order(merged_order)


class MergeNode(Node):
    """The workers' payloads in a fixed rotation; its state is every worker's position (see the module).

    Args:
        open_loader: Builds the DataLoader iterator over a `WorkerStream` given the workers' states and the
            exhausted workers.
        num_workers: The DataLoader's num_workers (0 counts as one stream, in the main process).
    """

    def __init__(
        self, open_loader: Callable[[dict[int, State], frozenset[int]], Iterator[Item]], num_workers: int
    ) -> None:
        super().__init__()
        self.open_loader = open_loader
        self.streams = max(1, num_workers)
        self.states: dict[int, State] = {}
        self.next_worker = 0
        self.exhausted: set[int] = set()
        # For the stall watchdog: since when the merge waits for worker `next_worker` (None: not waiting),
        # and when each worker's latest item arrived (monotonic seconds).
        self.waiting_since: float | None = None
        self.arrived_at: dict[int, float] = {}
        # Each worker's latest running stage times, as they arrive (`stage_times`).
        self.worker_times: dict[int, StageTimes] = {}

    def gen(self) -> Iterator[Any]:
        source = self.open_loader(dict(self.states), frozenset(self.exhausted))
        waiting: dict[int, deque[Item]] = {w: deque() for w in range(self.streams)}
        streams, states, exhausted, arrived = self.streams, self.states, self.exhausted, self.arrived_at
        worker_times = self.worker_times
        clock = time.monotonic
        try:
            while len(exhausted) < streams:
                w = self.next_worker
                if w in exhausted:
                    self.next_worker = (w + 1) % streams
                    continue
                queue = waiting[w]
                if not queue:
                    self.waiting_since = clock()
                while not queue:
                    try:
                        item = next(source)
                    except StopIteration:
                        raise StateError(
                            f"DataLoader worker {w} stopped without its end marker; was the dataset "
                            "iterated outside TorchLoader?"
                        ) from None
                    waiting[item[0]].append(item)
                    arrived[item[0]] = clock()
                    if item[4] is not None:
                        worker_times[item[0]] = item[4]
                self.waiting_since = None
                _, payload, state, done, _ = queue.popleft()
                if state is not None:
                    states[w] = state
                self.next_worker = (w + 1) % streams
                if done:
                    exhausted.add(w)
                    continue
                yield payload
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    @property
    def skipped_shards(self) -> int:
        """Shards the workers skipped (`on_error="skip"`), as of the payloads consumed so far.

        Carried in each worker's state (`PipelineIterator.position`), so it costs nothing extra per item.
        """
        return sum(_skipped(s) for s in self.states.values())

    def stage_times(self) -> StageTimes:
        """The workers' stage times summed, as of their latest items to arrive."""
        return add_times(list(self.worker_times.values()))

    @staticmethod
    def worker_states(state: State) -> dict[int, State]:
        """Each worker's pipeline state in a merge state, by worker id (workers not started are absent)."""
        return _worker_states(field(state, "workers", dict))

    @staticmethod
    def exhausted_workers(state: State) -> set[int]:
        """The workers whose streams had ended when a merge state was taken."""
        return _worker_ids(field(state, "exhausted", list))

    def state_dict(self) -> MergeState:
        return {
            "workers": {str(w): s for w, s in sorted(self.states.items())},
            "next_worker": self.next_worker,
            "exhausted": sorted(self.exhausted),
        }

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        workers = _worker_states(field(state, "workers", dict))
        next_worker = field(state, "next_worker", int)
        exhausted = _worker_ids(field(state, "exhausted", list))
        ids = {*workers, *exhausted, next_worker}
        if any(not 0 <= w < self.streams for w in ids):
            raise StateError(
                f"resume state names DataLoader workers {sorted(ids)}, this loader has "
                f"{self.streams} stream(s); resume with the same num_workers"
            )
        self.states = workers
        self.next_worker = next_worker
        self.exhausted = exhausted


class MergeState(TypedDict):
    """A `MergeNode`'s state: each started worker's flat state (`DatasetState`, by worker id), the next
    worker in the rotation and the workers whose streams had ended."""

    workers: dict[str, State]
    next_worker: int
    exhausted: list[int]


def _worker_states(workers: dict[object, object]) -> dict[int, State]:
    """A merge state's ``workers``, by worker id (StateError naming the field when it is not that)."""
    try:
        states: dict[int, State] = {int(str(w)): s for w, s in workers.items() if isinstance(s, dict)}
    except ValueError as exc:
        raise StateError(f"resume state field 'workers' has a key that is not a worker id ({exc})") from None
    if len(states) != len(workers):
        raise StateError("resume state field 'workers' holds a worker state that is not an object")
    return states


def _worker_ids(ids: list[object]) -> set[int]:
    """A merge state's ``exhausted`` worker ids (StateError naming the field when one is not an id)."""
    if not all(isinstance(w, int) for w in ids):
        raise StateError(f"resume state field 'exhausted'={ids!r} must list worker ids")
    return {w for w in ids if isinstance(w, int)}


def _skipped(state: State) -> int:
    """The shards a worker's flat state says it skipped (`DatasetState.skipped_shards`)."""
    skipped = state.get("skipped_shards", 0)
    return skipped if isinstance(skipped, int) else 0
