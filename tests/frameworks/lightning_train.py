"""PyTorch Lightning trains a tiny model on two CPU ranks from a shardcache loader, as its docs launch it.

    python tests/frameworks/lightning_train.py --shards 'data/shard_{0..7}.tar' --out out/ \
        --runs dataloader,torchloader

Lightning's "ddp" strategy starts rank 1 by running this same script again (its subprocess launcher), and
both ranks run `main`. Each run is one `Trainer(accelerator="cpu", devices=2, strategy="ddp",
max_epochs=3).fit(...)`; the runs of `--runs` go one after the other in the same two processes (the first
fit starts rank 1 and the process group, later fits reuse them). Every training step records its keys;
after each fit, each rank writes `<out>/<run>/rank<r>.json`.

Runs:
- dataloader: a plain torch DataLoader (`batch_size=8, num_workers=2`) over a Dataset of the shards'
  manifest (`--manifest`: every shard's sample count, so the DataLoader has a length and Lightning stops
  each epoch after that many batches), whose `count_samples()` ran at the start of the script, before
  any Trainer or process group existed (so later runs may come before it).
- torchloader: `fit(model, train_dataloaders=TorchLoader(ds, batch_size=8, num_workers=2))`.
- datamodule: the recipe: a LightningDataModule whose `train_dataloader()` returns the TorchLoader,
  `ShardcacheCallback()`, and `ModelCheckpoint(every_n_train_steps=K)` (files
  `<out>/datamodule/ckpt/step=<n>.ckpt`).
- resumed: the recipe again, `fit(..., ckpt_path=--resume)`.
- no_callback: a TorchLoader with `ModelCheckpoint(every_n_train_steps=K)` and no ShardcacheCallback,
  stopped by `max_steps=K+2`.

The dataloader and torchloader runs keep Lightning's default checkpointing (a checkpoint at the end of
every epoch), as users get it.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy

from shardcache import Dataset, TorchLoader
from tests.frameworks.train_support import (
    BATCH,
    EPOCHS,
    PG_TIMEOUT_S,
    WORKERS,
    Recorder,
    dataset,
    loss_of,
)

RUNS = ("dataloader", "torchloader", "datamodule", "resumed", "no_callback")


class KeyRecorder(pl.LightningModule):
    """nn.Linear(1, 1); each training step records the global step, the epoch and the batch's keys."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.recorder = Recorder()
        self.batches_planned: int | None = None

    def on_train_start(self) -> None:
        # The batches Lightning plans per epoch: len() of the loader, or None without one.
        planned = self.trainer.num_training_batches
        self.batches_planned = None if planned == float("inf") else int(planned)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.recorder.record(self.global_step, self.current_epoch, batch["kid"])
        return loss_of(self.layer, batch["x"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


class ShardData(pl.LightningDataModule):
    """The DataModule recipe: `train_dataloader()` returns a shardcache TorchLoader."""

    def __init__(self, shards: str) -> None:
        super().__init__()
        self.shards = shards

    def train_dataloader(self) -> Any:
        return TorchLoader(dataset(self.shards), batch_size=BATCH, num_workers=WORKERS)


def fit(run: str, args: argparse.Namespace, counted: Dataset | None) -> None:
    out: Path = args.out / run
    data: dict[str, Any] = {}
    callbacks: list[Callback] = []
    max_steps = -1
    if run == "dataloader":
        data["train_dataloaders"] = torch.utils.data.DataLoader(
            # a torch IterableDataset at run time (registered), not to a type checker
            counted,  # type: ignore[arg-type]
            batch_size=BATCH,
            num_workers=WORKERS,
        )
    elif run in ("torchloader", "no_callback"):
        data["train_dataloaders"] = TorchLoader(dataset(args.shards), batch_size=BATCH, num_workers=WORKERS)
    else:
        data["datamodule"] = ShardData(args.shards)
    if run in ("datamodule", "resumed"):
        from shardcache.lightning import ShardcacheCallback

        callbacks.append(ShardcacheCallback())
    if run in ("datamodule", "resumed", "no_callback"):
        every = args.checkpoint_every
        callbacks.append(
            ModelCheckpoint(dirpath=out / "ckpt", filename="{step}", every_n_train_steps=every, save_top_k=-1)
        )
    if run == "no_callback":
        max_steps = args.checkpoint_every + 2

    model = KeyRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        # strategy="ddp", with a short process-group timeout: a rank left waiting fails, it does not hang.
        strategy=DDPStrategy(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S)),
        max_epochs=EPOCHS,
        max_steps=max_steps,
        callbacks=callbacks,
        default_root_dir=out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    completed = False
    try:
        trainer.fit(model, **data, ckpt_path=args.resume if run == "resumed" else None)
        completed = True
    finally:
        model.recorder.length = model.batches_planned
        model.recorder.write(out, trainer.global_rank, trainer.world_size, completed=completed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--manifest", help="the shards' manifest (dataloader run)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", required=True, help=f"comma-separated, in order: {', '.join(RUNS)}")
    parser.add_argument("--checkpoint-every", type=int, default=27, help="ModelCheckpoint every N steps")
    parser.add_argument("--resume", default=None, help="the checkpoint the resumed run starts from")
    args = parser.parse_args()
    runs = args.runs.split(",")
    for run in runs:
        if run not in RUNS:
            parser.error(f"unknown run {run!r}")
    counted = None
    if "dataloader" in runs:
        counted = dataset(args.manifest)
        counted.count_samples()  # before any Trainer or process group, as a user checking the data would
    for run in runs:
        fit(run, args, counted)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
