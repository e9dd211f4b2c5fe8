"""`TorchLoader`: a torch DataLoader over a Dataset, plus post-merge stages run in the main process.

Recommended pattern: workers emit micro-batches (`batch_size=32, collate_fn=lambda x: x`), then `.unbatch()`,
a loader-side `.shuffle(...)` that mixes samples across workers, optional `.assemble(...)`, and `.batch(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.dataset import Dataset, _callable, _positive_int
from shardcache.stages import AssembleStage, BatchStage, MapStage, Node, ShuffleStage, Stage, UnbatchStage
from shardcache.stages.base import State


def _torch_data() -> Any:
    try:
        import torch.utils.data as data
    except ImportError as exc:
        raise ImportError(
            "TorchLoader needs PyTorch: install the torch extra (pip install 'shardcache[torch]')"
        ) from exc
    return data


class _LoaderNode(Node):
    """The merged stream of the DataLoader's workers, as the first node of the loader-side stages."""

    # TODO(resume, issue 6): per-worker states (each worker's PipelineIterator state) and the order in which
    # the DataLoader interleaves workers make TorchLoader's state_dict; not implemented here.

    def __init__(self, iterable: Any) -> None:
        super().__init__()
        self.iterable = iterable

    def gen(self) -> Iterator[Any]:
        return iter(self.iterable)

    def state_dict(self) -> State:
        return {}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()


class TorchLoader:
    """A `torch.utils.data.DataLoader` over `dataset`, with loader-side stages in the main process.

    Args:
        dataset: The pipeline each worker iterates (its slot comes from rank and worker id).
        num_workers: DataLoader worker processes (0: iterate in the main process).
        batch_size: Worker-side batch size (None: samples pass one by one).
        collate_fn: Worker-side collate function (`lambda x: x` keeps lists of samples).
        **loader_kwargs: Any other DataLoader argument (pin_memory, prefetch_factor, persistent_workers, ...).

    Example:
        >>> loader = (TorchLoader(ds, num_workers=8, batch_size=32, collate_fn=lambda x: x)  # doctest: +SKIP
        ...           .unbatch().shuffle(4096).batch(64))
    """

    def __init__(
        self,
        dataset: Dataset,
        num_workers: int = 0,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        *,
        _stages: Sequence[Stage] = (),
        **loader_kwargs: Any,
    ) -> None:
        _torch_data()
        if not isinstance(dataset, Dataset):
            raise TypeError(f"dataset={dataset!r}: expected a shardcache.Dataset")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r}: expected an integer >= 0")
        if batch_size is not None:
            _positive_int("batch_size", batch_size)
        self.dataset = dataset
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.loader_kwargs = loader_kwargs
        self.stages: tuple[Stage, ...] = tuple(_stages)

    def _add(self, stage: Stage) -> TorchLoader:
        return TorchLoader(
            self.dataset,
            self.num_workers,
            self.batch_size,
            self.collate_fn,
            _stages=(*self.stages, stage),
            **self.loader_kwargs,
        )

    def map(self, fn: Callable[[Any], Any]) -> TorchLoader:
        """Apply `fn` to every item in the main process."""
        return self._add(MapStage(_callable("fn", fn)))

    def unbatch(self) -> TorchLoader:
        """Flatten the workers' batches into samples."""
        return self._add(UnbatchStage())

    def shuffle(self, buffer_size: int, initial: int | None = None, seed: int | None = None) -> TorchLoader:
        """Shuffle across workers; seeded from the dataset's context (TP co-members agree) unless `seed`."""
        _positive_int("buffer_size", buffer_size)
        if initial is not None:
            _positive_int("initial", initial)
        return self._add(ShuffleStage(buffer_size, initial, seed))

    def assemble(self, factory: Callable[[RuntimeContext], Any], drop_last: bool = False) -> TorchLoader:
        """Assemble in the main process; `factory` receives the dataset's resolved context."""
        return self._add(AssembleStage(_callable("factory", factory), bool(drop_last)))

    def batch(
        self, batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> TorchLoader:
        """Batch in the main process."""
        _positive_int("batch_size", batch_size)
        return self._add(BatchStage(batch_size, bool(drop_last), collate_fn))

    def set_epoch(self, epoch: int) -> None:
        """Set the dataset's epoch (reaches workers started after this call)."""
        self.dataset.set_epoch(epoch)

    def dataloader(self) -> Any:
        """The underlying DataLoader (a new one per call)."""
        data = _torch_data()
        kwargs = dict(self.loader_kwargs)
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        return data.DataLoader(
            self.dataset, num_workers=self.num_workers, batch_size=self.batch_size, **kwargs
        )

    def __iter__(self) -> Iterator[Any]:
        loader = self.dataloader()
        if not self.stages:
            return iter(loader)
        ctx = self.dataset.resolve_context()
        node: Node = _LoaderNode(loader)
        for stage in self.stages:
            node = stage.node(node, ctx)
        return node
