"""TorchLoader over a plain iterable (mvp-dataset accepts any iterable): every worker iterates all of it.

The workers' items pass the loader-side stages like a Dataset's, but nothing here resumes: only a
`shardcache.Dataset` has positions to save (`UnsupportedResume` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shardcache.errors import UnsupportedResume
from shardcache.loader.stream import passthrough, torch_data
from shardcache.node import Node, State


class PlainStream:
    """What the DataLoader iterates over a plain iterable: all of it in each worker, batched as `WorkerStream`
    batches (samples as they are without a batch size)."""

    def __init__(
        self,
        iterable: Iterable[object],
        batch_size: int | None,
        collate_fn: Callable[[Any], Any] | None,
        drop_last: bool,
    ) -> None:
        self.iterable = iterable
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[object]:
        size, collate = self.batch_size, self.collate_fn
        if size is None:
            yield from (iter(self.iterable) if collate is None else map(collate, self.iterable))
            return
        collate = collate if collate is not None else torch_data().default_collate
        batch: list[object] = []
        for sample in self.iterable:
            batch.append(sample)
            if len(batch) == size:
                yield collate(batch)
                batch = []
        if batch and not self.drop_last:
            yield collate(batch)


class PlainNode(Node):
    """A DataLoader over a `PlainStream`, as the first node of the loader-side stages; it has no state."""

    def __init__(self, stream: PlainStream, num_workers: int, loader_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.stream = stream
        self.num_workers = num_workers
        self.loader_kwargs = loader_kwargs

    def gen(self) -> Iterator[object]:
        data = torch_data()
        if not issubclass(PlainStream, data.IterableDataset):
            data.IterableDataset.register(PlainStream)  # torch is imported lazily (see `_dataloader`)
        dataset = self.stream  # an IterableDataset by registration, which mypy cannot see
        loader = data.DataLoader(
            dataset,
            num_workers=self.num_workers,
            batch_size=None,
            collate_fn=passthrough,
            **self.loader_kwargs,
        )
        yield from loader

    def state_dict(self) -> State:
        return {}  # no position: stages above read it while they run; the loader's iterator refuses to save

    def load_state_dict(self, state: State) -> None:
        raise UnsupportedResume("TorchLoader over a plain iterable: only a shardcache.Dataset resumes")
