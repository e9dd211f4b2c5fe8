"""The Hugging Face Trainer: `ShardcacheCallback` saves and restores a TorchLoader's position with each
checkpoint, so `trainer.train(resume_from_checkpoint=...)` goes on exactly where the checkpoint was.

What the Trainer (transformers 5.x; docs/frameworks.md) does to a loader without a length, and why the
callback is what it is:

- It needs `max_steps`, counts an "epoch" as one pass over the loader and calls `set_epoch(epoch)` before
  each pass. On resume it cannot tell which epoch it was in (no length): it restarts its count at 0 and
  replays `global_step` batches through Accelerate's `skip_first_batches`, which cannot rebuild a
  TorchLoader (its loader-side stages and worker merge) and would replay the wrong epoch anyway.
- It saves no loader state, but calls every callback's `on_save` on every rank right after a checkpoint is
  written, and hands callbacks the loader it trains from.

So the callback, with a TorchLoader returned by the Trainer's `get_train_dataloader`:

- turns the Trainer's replay off (`ignore_data_skip=True`) and lets the loader count its own epochs (the
  Trainer's `set_epoch` numbers restart at 0 on resume; the loader's state knows the real one);
- on every save, gathers every rank's position into one job-wide state (a collective: every rank runs
  `on_save`) and writes it beside the checkpoint, as `shardcache_data.json` in `checkpoint-<step>/`;
- when training begins at a step past 0 (a resume), loads that state into the loader: each rank goes on
  from its own position, in the epoch the checkpoint was in.

A shardcache Dataset given as `train_dataset=` works for training (Accelerate's split is detected and the
Dataset reads the whole stream on each rank, `shardcache.frameworks`), but its mid-epoch resume is refused
with an error naming this recipe: the Trainer's replay would repeat and lose data.

Usage:
    >>> class MyTrainer(Trainer):  # doctest: +SKIP
    ...     def get_train_dataloader(self):
    ...         return TorchLoader(ds, batch_size=8, num_workers=4, collate_fn=collate)
    >>> trainer = MyTrainer(model=model, args=args, callbacks=[ShardcacheCallback()])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from shardcache.context import torch_distributed
from shardcache.errors import ConfigError
from shardcache.loader import TorchLoader

STATE_FILE = "shardcache_data.json"
CHECKPOINT_PREFIX = "checkpoint"  # the Trainer's checkpoint folders: checkpoint-<global step>


def checkpoint_dir(args: TrainingArguments, step: int) -> Path:
    """Where the Trainer writes the checkpoint of `step` (its naming: <output_dir>/checkpoint-<step>)."""
    if args.output_dir is None:  # TrainingArguments sets a default; a hand-made one may not
        raise ConfigError(
            "TrainingArguments.output_dir is None: set it, the Trainer saves its checkpoints there"
        )
    return Path(args.output_dir) / f"{CHECKPOINT_PREFIX}-{step}"


class ShardcacheCallback(TrainerCallback):  # type: ignore[misc]
    """Exact `resume_from_checkpoint` of a TorchLoader under the Hugging Face Trainer (see the module)."""

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        # The loader's state resumes the data; the Trainer's replay of batches must not run as well.
        args.ignore_data_skip = True

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        loader = _torch_loader(kwargs.get("train_dataloader"))
        loader.own_epochs = True
        if state.global_step == 0:
            return
        path = checkpoint_dir(args, state.global_step) / STATE_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path}: resuming at step {state.global_step} but the checkpoint has no shardcache data "
                "state (saved by ShardcacheCallback beside each checkpoint): resume from a checkpoint "
                "written with the callback, under the same output_dir"
            )
        loader.load_state_dict(json.loads(path.read_text()))

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        loader = _torch_loader(kwargs.get("train_dataloader"))
        loader.state_scope = "job"
        blob = loader.state_dict()  # every rank at once: the gather inside is a collective
        if _global_rank() == 0:
            folder = checkpoint_dir(args, state.global_step)
            folder.mkdir(parents=True, exist_ok=True)
            temp = folder / f".{STATE_FILE}.{os.getpid()}.tmp"
            temp.write_text(json.dumps(blob))
            temp.replace(folder / STATE_FILE)  # a checkpoint never holds half a state


def _torch_loader(loader: object) -> TorchLoader:
    if not isinstance(loader, TorchLoader):
        raise ConfigError(
            f"shardcache.transformers.ShardcacheCallback: the Trainer trains from {type(loader).__name__}, "
            "not a TorchLoader: return a shardcache.TorchLoader from your Trainer's get_train_dataloader() "
            "(docs/frameworks.md)"
        )
    return loader


def _global_rank() -> int:
    dist = torch_distributed()
    return 0 if dist is None else int(dist.get_rank())
