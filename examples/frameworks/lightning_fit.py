"""PyTorch Lightning: training and validation from shardcache, mid-epoch checkpoints, an exact resume.

    python examples/frameworks/toy.py /tmp/toy
    python examples/frameworks/lightning_fit.py --data /tmp/toy --out /tmp/pl-run
    python examples/frameworks/lightning_fit.py --data /tmp/toy --out /tmp/pl-run --resume   # last.ckpt

Two CPU processes: Lightning's "ddp" strategy starts the second by running this script again. Training
reads a reshuffled epoch every epoch; `ShardcacheCallback` makes each checkpoint hold every rank's position,
and `fit(ckpt_path="last")` goes on from the newest one exactly. Validation runs after every epoch on an
evaluation dataset: the same samples in the same order every time, each exactly once across the ranks
(the repeats that even out the ranks are masked).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy
from toy import StepTrace, Tiny, decode, squared_errors

from shardcache import Dataset, TorchLoader
from shardcache.lightning import ShardcacheCallback


class ToyData(pl.LightningDataModule):
    def __init__(self, data: Path) -> None:
        super().__init__()
        self.data = data

    def train_dataloader(self) -> TorchLoader:
        train = Dataset.from_source("tars", str(self.data / "train.manifest.jsonl")).shuffle(64).map(decode)
        return TorchLoader(train, batch_size=8, num_workers=2)

    def val_dataloader(self) -> TorchLoader:
        val = Dataset.from_source("tars", str(self.data / "val.manifest.jsonl")).map(decode)
        return TorchLoader(val.for_evaluation(), batch_size=8, num_workers=2)


class Regression(pl.LightningModule):
    def __init__(self, trace: StepTrace) -> None:
        super().__init__()
        self.model = Tiny()
        self.trace = trace

    def on_train_start(self) -> None:
        # The steps of an epoch on this rank: what Lightning planned its epochs with.
        self.trace.length = len(self.trainer.train_dataloader)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.trace.train_step(self.global_step, batch, self.current_epoch)
        return squared_errors(self.model(batch["x"]), batch).mean()

    def on_validation_epoch_start(self) -> None:
        self.val_sum = torch.zeros(2)  # squared errors, samples (repeats left out)
        if not self.trainer.sanity_checking:
            self.trace.begin_eval(self.global_step)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            self.trace.eval_step(batch)
        errors = squared_errors(self.model(batch["x"]), batch)
        self.val_sum += torch.stack([errors.sum(), batch["valid"].sum()])

    def on_validation_epoch_end(self) -> None:
        total = self.trainer.strategy.reduce(self.val_sum, reduce_op="sum")
        self.log("val_mse", total[0] / total[1], sync_dist=True)  # the same on every rank already

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="the folder toy.py wrote")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=27, help="a checkpoint every N training steps")
    parser.add_argument("--resume", action="store_true", help="go on from <out>/checkpoints/last.ckpt")
    parser.add_argument("--trace", help="write the keys each step saw to TRACE/rank<r>.json")
    args = parser.parse_args()

    data, trace = ToyData(args.data), StepTrace(args.trace)
    model = Regression(trace)
    checkpoints = ModelCheckpoint(
        dirpath=args.out / "checkpoints",
        filename="{step}",
        every_n_train_steps=args.save_every,
        save_top_k=-1,
        save_last=True,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(timeout=datetime.timedelta(seconds=60)),  # a stuck rank fails, not hangs
        max_epochs=args.epochs,
        callbacks=[ShardcacheCallback(), checkpoints],
        default_root_dir=args.out,
        logger=False,
        enable_progress_bar=False,
    )
    completed = False
    try:
        trainer.fit(model, datamodule=data, ckpt_path="last" if args.resume else None)
        completed = True
    finally:
        trace.write(trainer.global_rank, trainer.world_size, completed=completed)


if __name__ == "__main__":
    main()
