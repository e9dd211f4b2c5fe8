"""TorchLoader's resumable merge of DataLoader workers.

Each worker iterates its own slot of the pipeline through `WorkerStream`, which yields
``(worker_id, payload, state_after_payload, done)``: the payload is one sample or one worker-side batch,
the state is the worker's pipeline position after it, and a final ``done`` item says the worker's stream
has ended. The main process does not trust the order in which the DataLoader hands items over (after a
resume it starts at worker 0 again, whatever the rotation was); `MergeNode` buffers what arrives and
yields workers in its own strict rotation, skipping exhausted ones.

So the merged position is small and exact: each worker's pipeline state after the last payload the main
process consumed (items the DataLoader prefetched but nobody consumed are not counted), the next worker in
the rotation, and the exhausted workers. Resuming passes each worker its state through the wrapped dataset
before the DataLoader iterator is created; a worker loads it when it starts.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from shardcache.dataset import Dataset
from shardcache.errors import StateError
from shardcache.stages.base import Node, State, field

logger = logging.getLogger(__name__)

Item = tuple[int, Any, State | None, bool]


def passthrough(item: Any) -> Any:
    """The DataLoader's collate_fn over `WorkerStream`: workers already collated their payloads."""
    return item


class WorkerStream:
    """What the DataLoader iterates in each worker (or in the main process with num_workers=0).

    Args:
        dataset: The pipeline; each worker iterates a private copy.
        batch_size: Worker-side batch size (None: one sample per payload).
        collate_fn: Worker-side collate (None: torch's default_collate for batches, default_convert else).
        drop_last: Drop a worker's last incomplete batch.
        states: Worker id -> pipeline state to resume from (absent: start fresh).
        exhausted: Workers whose stream had already ended; they yield nothing.
        epoch: The epoch fresh workers start at (None: the dataset's).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None,
        collate_fn: Callable[[Any], Any] | None,
        drop_last: bool,
        states: dict[int, State],
        exhausted: frozenset[int],
        epoch: int | None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.states = states
        self.exhausted = exhausted
        self.epoch = epoch

    def __iter__(self) -> Iterator[Item]:
        import torch.utils.data as data

        info = data.get_worker_info()
        wid = 0 if info is None else int(info.id)
        if wid in self.exhausted:
            return
        ds = self.dataset.with_stages(self.dataset.stages)  # a private copy: the caller's keeps its state
        if self.epoch is not None:
            ds.set_epoch(self.epoch)
        state = self.states.get(wid)
        if state is not None:
            ds.load_state_dict(state)
        iterator = ds.iter_context(None)
        snapshot = iterator.state_dict
        try:
            size = self.batch_size
            if size is None:
                convert = self.collate_fn if self.collate_fn is not None else data.default_convert
                for sample in iterator:
                    yield wid, convert(sample), snapshot(), False
            else:
                collate = self.collate_fn if self.collate_fn is not None else data.default_collate
                batch: list[Any] = []
                for sample in iterator:
                    batch.append(sample)
                    if len(batch) == size:
                        yield wid, collate(batch), snapshot(), False
                        batch = []
                if batch and not self.drop_last:
                    yield wid, collate(batch), snapshot(), False
            yield wid, None, snapshot(), True
        finally:
            iterator.close()


class WorkerLauncher:
    """Starts the DataLoader over a copy of `stream` that resumes the given workers' states."""

    def __init__(self, stream: WorkerStream, num_workers: int, loader_kwargs: dict[str, Any]) -> None:
        self.stream = stream
        self.num_workers = num_workers
        self.loader_kwargs = loader_kwargs

    def __call__(self, states: dict[int, State], exhausted: frozenset[int]) -> Iterator[Item]:
        import torch.utils.data as data

        base = self.stream
        # The base stream's states start workers that have no position yet (an elastic resume hands every
        # new worker the same start state); a worker's own position, once it has one, wins.
        states = {**base.states, **states}
        stream = WorkerStream(
            base.dataset, base.batch_size, base.collate_fn, base.drop_last, states, exhausted, base.epoch
        )
        if not isinstance(stream, data.IterableDataset):
            data.IterableDataset.register(WorkerStream)
        # WorkerStream is an IterableDataset by registration (torch is imported lazily); mypy cannot see it.
        dataset: Any = stream
        loader: Any = data.DataLoader(
            dataset,
            num_workers=self.num_workers,
            batch_size=None,
            collate_fn=passthrough,
            **self.loader_kwargs,
        )
        return iter(loader)


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

    def gen(self) -> Iterator[Any]:
        source = self.open_loader(dict(self.states), frozenset(self.exhausted))
        waiting: dict[int, deque[Item]] = {w: deque() for w in range(self.streams)}
        streams, states, exhausted = self.streams, self.states, self.exhausted
        try:
            while len(exhausted) < streams:
                w = self.next_worker
                if w in exhausted:
                    self.next_worker = (w + 1) % streams
                    continue
                queue = waiting[w]
                while not queue:
                    try:
                        item = next(source)
                    except StopIteration:
                        raise StateError(
                            f"DataLoader worker {w} stopped without its end marker; was the dataset "
                            "iterated outside TorchLoader?"
                        ) from None
                    waiting[item[0]].append(item)
                _, payload, state, done = queue.popleft()
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

        Carried in each worker's state (`PipelineIterator.state_dict`), so it costs nothing extra per item.
        """
        return sum(int(s.get("skipped_shards", 0)) for s in self.states.values())

    def state_dict(self) -> State:
        return {
            "workers": {str(w): s for w, s in sorted(self.states.items())},
            "next_worker": self.next_worker,
            "exhausted": sorted(self.exhausted),
        }

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        workers = field(state, "workers", dict)
        next_worker = field(state, "next_worker", int)
        exhausted = field(state, "exhausted", list)
        ids = [int(w) for w in workers] + [int(w) for w in exhausted] + [next_worker]
        if any(not 0 <= w < self.streams for w in ids):
            raise StateError(
                f"resume state names DataLoader workers {sorted(set(ids))}, this loader has "
                f"{self.streams} stream(s); resume with the same num_workers"
            )
        self.states = {int(w): s for w, s in workers.items()}
        self.next_worker = next_worker
        self.exhausted = {int(w) for w in exhausted}
