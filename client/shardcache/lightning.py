"""PyTorch Lightning: `ShardcacheCallback` makes a TorchLoader's mid-epoch checkpoints exact.

What Lightning does to a loader it trains from (pytorch-lightning 2.6; docs/frameworks.md):

- It iterates the loader once per epoch and calls `set_epoch` only on a sampler: a TorchLoader (or a
  Dataset in a plain DataLoader) moves to the next epoch by itself (`shardcache.epochs`).
- Its fetcher reads one batch ahead of a loader without a length, to know which batch is the last; with a
  length (`len(TorchLoader)`, known with manifests and `even=`) it stops after that many batches.
- On a checkpoint every rank calls the loader's `state_dict()` (the loop's `on_save_checkpoint`), but only
  rank 0's checkpoint file is written, and on `fit(ckpt_path=...)` every rank loads that one state.

So a TorchLoader's own state would skip the batch fetched ahead and could resume rank 0 only. The callback
tells each TorchLoader Lightning trains from how many batches the fetcher holds, so `state_dict()` names
the position of the checkpointed step, and makes its state job-wide (`state_scope="job"`: every rank's
position gathered into the one state rank 0 saves). Without the callback, TorchLoader refuses a mid-epoch
checkpoint by Lightning with an error naming it, rather than save a state that resumes wrong.

Usage:
    >>> trainer = Trainer(..., callbacks=[ShardcacheCallback()])  # doctest: +SKIP
    >>> trainer.fit(model, train_dataloaders=TorchLoader(ds, batch_size=32, num_workers=8))  # doctest: +SKIP

Works with `lightning.pytorch` and with `pytorch_lightning`, whichever the trainer imported first.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from shardcache.loader import TorchLoader


def _lightning() -> Any:
    """The Lightning package the trainer uses: one already imported, else whichever is installed."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if name in sys.modules:
            return sys.modules[name]
    for name in ("pytorch_lightning", "lightning.pytorch"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        "shardcache.lightning needs PyTorch Lightning: pip install 'shardcache[lightning]' "
        "(pytorch-lightning), or the lightning package"
    )


def torch_loaders(iterables: Any) -> Iterator[TorchLoader]:
    """The TorchLoaders in what Lightning trains from (a loader, or a list or dict of them, nested)."""
    if isinstance(iterables, TorchLoader):
        yield iterables
    elif isinstance(iterables, Mapping):
        for value in iterables.values():
            yield from torch_loaders(value)
    elif isinstance(iterables, (list, tuple)):
        for value in iterables:
            yield from torch_loaders(value)


def _fetched_ahead(trainer: Any) -> int:
    """Batches Lightning's training fetcher holds beyond the step it is at (its prefetch buffer)."""
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    return len(getattr(fetcher, "batches", ()) or ())


# Lightning's warning for any IterableDataset with a length: it cannot tell whether each DataLoader worker
# reads its own part. A shardcache Dataset deals each worker its own samples, and its length counts the
# batches those workers really make (`shardcache.pipeline.length`), so the warning does not apply.
_LENGTH_WARNING = r"Your `IterableDataset` has `__len__` defined"


class ShardcacheCallback(_lightning().Callback):  # type: ignore[misc]
    """Exact mid-epoch resume of TorchLoaders under Lightning, on any number of ranks (see the module)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        warnings.filterwarnings("ignore", message=_LENGTH_WARNING)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Before any checkpoint of this run; the iterator Lightning made already keeps the position before
        # its latest batch, so the first epoch's checkpoints are exact too.
        for loader in torch_loaders(trainer.train_dataloader):
            loader.checkpoint_with(lambda: _fetched_ahead(trainer), keep=1, scope="job")
