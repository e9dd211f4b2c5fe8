"""What a training framework does to a shardcache loader, seen from inside it.

Two frameworks take a dataset's stream out of its hands, and the loader must know to stay correct:

- **Accelerate** (and the Hugging Face Trainer, which prepares its DataLoader through it) splits an
  IterableDataset's stream among the ranks itself: `accelerator.prepare(DataLoader(ds))` either iterates it
  on rank 0 and sends each rank a slice of every batch (`DataLoaderDispatcher`, the default for iterable
  datasets), or iterates it on every rank and keeps each rank's slice (`IterableDatasetShard`, with
  `dispatch_batches=False`). Both need every rank's dataset to yield the *whole* stream; a shardcache
  Dataset, which deals shards to ranks by itself, would hand Accelerate one rank's share and half the data
  would never be seen. `accelerate_splits` tells `Dataset.__iter__` to read as a job of one process then.
  Accelerate gives no public signal for this, so it is read from Accelerate's own state: the dataloader it
  is iterating (`GradientState`, set before the DataLoader's workers start, so a forked worker sees it too)
  and the dataset a worker iterates (`IterableDatasetShard` around ours). A TorchLoader passed to `prepare`
  is returned unchanged and deals by rank as usual — the recipe that reads each shard once per epoch.
- **Lightning** saves a loader's `state_dict()` from rank 0 only, one batch after the step it checkpoints
  (its fetcher reads one ahead of an unsized loader). `called_by_lightning` lets TorchLoader refuse to give
  Lightning a state that would resume wrong, naming the callback that makes it right
  (`shardcache.lightning.ShardcacheCallback`).
- **The Hugging Face Trainer** resumes a loader it did not prepare by rebuilding it around its dataset
  (Accelerate's `skip_first_batches`, which reads DataLoader attributes a TorchLoader does not have).
  `called_by_accelerate_skip` lets TorchLoader refuse that with the same kind of error, naming
  `shardcache.transformers.ShardcacheCallback`.
- **torch's DataLoader** turns its dataset's `len()` into batches with a formula that ignores its workers
  (each worker batches its own share); `length_asker` tells `Dataset.__len__` which DataLoader is asking,
  so the answer can make that formula give the batches the workers really yield.

Only modules already imported are consulted: nothing here imports a framework.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError

_LIGHTNING = ("pytorch_lightning.", "lightning.pytorch.", "lightning_fabric.", "lightning.fabric.")
# Frames between a loader's `state_dict` and Lightning's code: its `_state_dicts` list comprehension and the
# method around it (a frame each), with room for a wrapper of the user's.
_LIGHTNING_DEPTH = 5


def called_by_lightning(depth: int = 1) -> bool:
    """Whether the caller of the function `depth` frames up was called from Lightning's code."""
    frame: FrameType | None = sys._getframe(depth + 1)
    for _ in range(_LIGHTNING_DEPTH):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith(_LIGHTNING):
            return True
        frame = frame.f_back
    return False


def called_by_accelerate_skip(depth: int = 1) -> bool:
    """Whether the caller of the function `depth` frames up runs inside Accelerate's `skip_first_batches`."""
    frame: FrameType | None = sys._getframe(depth + 1)
    for _ in range(_ACCELERATE_SKIP_DEPTH):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "skip_first_batches" and str(frame.f_globals.get("__name__", "")).startswith(
            "accelerate."
        ):
            return True
        frame = frame.f_back
    return False


# Frames between an attribute lookup on a TorchLoader and `skip_first_batches`: its dict comprehension.
_ACCELERATE_SKIP_DEPTH = 3


@dataclass(frozen=True)
class LengthAsker:
    """A torch DataLoader asking its dataset's length (`length_asker`): its workers and batching, and whether
    Accelerate splits the dataset's stream among the ranks itself (the dataset then reads the whole epoch)."""

    workers: int
    batch_size: int | None
    drop_last: bool
    splits: bool


# Frames between `Dataset.__len__` and the `__len__` asking: none (`len()` is a builtin), one for a wrapper.
_LENGTH_DEPTH = 2


def length_asker(depth: int = 1) -> LengthAsker | None:
    """Who asks the length of the dataset whose `__len__` is `depth` frames up: torch's `DataLoader.__len__`
    (Accelerate's loaders run it too) or Accelerate's `IterableDatasetShard.__len__`; None for anyone
    else (the user's code, a progress bar)."""
    askers: dict[CodeType, str] = {}
    loader_module = sys.modules.get("torch.utils.data.dataloader")
    if loader_module is not None:
        askers[loader_module.DataLoader.__len__.__code__] = "loader"
    accelerate = sys.modules.get("accelerate.data_loader")
    shard_type = getattr(accelerate, "IterableDatasetShard", None)
    if shard_type is not None:
        askers[shard_type.__len__.__code__] = "shard"
    frame: FrameType | None = sys._getframe(depth + 1)
    for _ in range(_LENGTH_DEPTH):
        if frame is None:
            return None
        kind = askers.get(frame.f_code)
        if kind == "shard":  # its own length is the whole stream's, in samples
            return LengthAsker(0, None, False, splits=True)
        if kind == "loader":
            loader = frame.f_locals.get("self")
            dispatcher = getattr(accelerate, "DataLoaderDispatcher", ())
            size = getattr(loader, "batch_size", None)
            return LengthAsker(
                int(getattr(loader, "num_workers", 0)),
                size if isinstance(size, int) else None,
                bool(getattr(loader, "drop_last", False)),
                splits=isinstance(loader, dispatcher),
            )
        frame = frame.f_back
    return None


def accelerate_active_dataloader() -> Any:
    """The dataloader Accelerate is iterating in this process (inherited by a forked worker), else None."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return None
    try:
        refs = state.GradientState._shared_state.get("_dataloader_references_ref") or [None]
        ref = refs[-1]
        return None if ref is None else ref()
    except (AttributeError, TypeError, IndexError):  # another Accelerate version: no signal
        return None


def accelerate_splits(dataset: object) -> bool:
    """Whether Accelerate splits `dataset`'s stream among the ranks itself (see the module)."""
    data_loader = sys.modules.get("accelerate.data_loader")
    if data_loader is None:
        return False
    shard_type = getattr(data_loader, "IterableDatasetShard", ())
    info = _worker_info()
    if info is not None and _wraps(info.dataset, dataset, shard_type):
        return True
    active = accelerate_active_dataloader()
    if active is None:
        return False
    held = getattr(active, "dataset", None)
    if held is dataset and isinstance(active, getattr(data_loader, "DataLoaderDispatcher", ())):
        return True
    return _wraps(held, dataset, shard_type)


def accelerate_dispatch_batch(dataset: object) -> int | None:
    """The batch size of Accelerate's `DataLoaderDispatcher` when it reads `dataset` in several DataLoader
    workers (whose short last batches it would cut into in the middle of the stream), else None."""
    data_loader = sys.modules.get("accelerate.data_loader")
    info = _worker_info()
    if data_loader is None or info is None or int(info.num_workers) < 2:
        return None
    active = accelerate_active_dataloader()
    dispatcher = getattr(data_loader, "DataLoaderDispatcher", ())
    if not isinstance(active, dispatcher) or active.dataset is not dataset:
        return None
    size = getattr(active, "batch_size", None)
    return size if isinstance(size, int) and size > 1 else None


def accelerate_skips_batches() -> bool:
    """Whether Accelerate is replaying batches to skip them (`skip_first_batches`, a Trainer's resume)."""
    active = accelerate_active_dataloader()
    return active is not None and int(getattr(active, "skip_batches", 0) or 0) > 0


def _worker_info() -> Any:
    """torch's DataLoader worker info of this process (None in the trainer, or without torch loaded)."""
    torch_data = sys.modules.get("torch.utils.data")
    return None if torch_data is None else torch_data.get_worker_info()


def _wraps(held: object, dataset: object, shard_type: Any) -> bool:
    return isinstance(held, shard_type) and getattr(held, "dataset", None) is dataset


def accelerate_context(ctx: RuntimeContext, dataset: object) -> RuntimeContext:
    """The context a pass of `dataset` reads with, resolved as `ctx`: a job of one process where Accelerate
    splits the stream among the ranks itself (`accelerate_splits`), for every rank must then yield the
    whole epoch; else `ctx`.

    Raises:
        ConfigError: [UnsupportedResume] Accelerate replays batches to skip them over such a dataset.
    """
    if not accelerate_splits(dataset):
        return ctx
    if accelerate_skips_batches():
        raise ConfigError(
            "Accelerate is replaying batches to skip them (skip_first_batches: the Hugging Face "
            "Trainer's resume_from_checkpoint, or your own loop): over a shardcache Dataset that "
            "replays the epoch set now, which the Trainer sets to 0 for a loader without a length, so "
            "the resumed run would repeat and lose data. Resume through a TorchLoader with its state "
            "instead: see docs/frameworks.md (shardcache.transformers.ShardcacheCallback)",
            code="UnsupportedResume",
        )
    return as_one_process(ctx)


def as_one_process(ctx: RuntimeContext) -> RuntimeContext:
    """`ctx` as a job of one process (its workers, epoch and seed): the reader of a whole epoch."""
    return RuntimeContext(
        rank=0,
        world_size=1,
        worker_id=ctx.worker_id,
        num_workers=ctx.num_workers,
        epoch=ctx.epoch,
        seed=ctx.seed,
    )
