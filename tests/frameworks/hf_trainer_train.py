"""The Hugging Face Trainer trains a tiny model on two CPU ranks from shardcache data, launched by torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/frameworks/hf_trainer_train.py \
        --shards 'data/shard_{0..7}.tar' --out out/ --runs train_dataset,torchloader

The model is an nn.Module whose forward returns {"loss": ...} (the Trainer accepts it); `compute_loss`
records each step's keys, and a callback numbers the passes over the loader (the Trainer's "epochs": an
unsized loader needs `max_steps`, and each pass is one epoch). The runs of `--runs` go one after the other
in the same two processes; each is one `trainer.train()` with its output directory `<out>/<run>/trainer`
(checkpoints every `--save-steps` steps), after which each rank writes `<out>/<run>/rank<r>.json`.

Runs:
- train_dataset: `Trainer(train_dataset=<shardcache Dataset>)`; the Trainer builds a DataLoader and
  prepares it through Accelerate (a DataLoaderDispatcher: rank 0 reads, every rank gets a slice).
- torchloader: the recipe over shards without sample counts (so the TorchLoader has no length and the
  Trainer needs max_steps): a Trainer subclass whose `get_train_dataloader()` returns a TorchLoader, with
  `callbacks=[shardcache.transformers.ShardcacheCallback()]`.
- bare: the same TorchLoader without the callback.
- train_dataset_resumed, torchloader_resumed, bare_resumed: the same, `trainer.train(
  resume_from_checkpoint=True)` (the latest checkpoint in its output directory, which the caller put
  there). bare_resumed must fail on every rank at once, before any collective: it records its error in its
  report instead of raising, and the launch goes on with the next run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from shardcache import TorchLoader
from tests.frameworks.train_support import BATCH, EPOCHS, PG_TIMEOUT_S, WORKERS, Recorder, dataset, loss_of

# The Trainer needs max_steps for a loader without a length. An epoch is 20 steps here (157 or 158 samples
# per rank in batches of 8 from 2 workers, each with its own last, short batch); 70 steps are three whole
# epochs and part of a fourth even if an epoch took up to 23 steps.
STEPS_PER_EPOCH = 20
MAX_STEPS = EPOCHS * STEPS_PER_EPOCH + 10
RUNS = (
    "train_dataset",
    "torchloader",
    "bare",
    "train_dataset_resumed",
    "torchloader_resumed",
    "bare_resumed",
)


class KeyModel(torch.nn.Module):
    """nn.Linear(1, 1) behind the Trainer's calling convention: keyword inputs in, {"loss": ...} out."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor, kid: torch.Tensor) -> dict[str, torch.Tensor]:
        # `kid` is an argument so that the Trainer's column filter (remove_unused_columns, which keeps what
        # forward takes) leaves it in the batch for compute_loss to record.
        return {"loss": loss_of(self.layer, x)}


class Passes(TrainerCallback):  # type: ignore[misc]
    """Numbers the passes over the loader this process started (the Trainer's epochs, from 0)."""

    def __init__(self) -> None:
        self.epoch = -1

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.epoch += 1


class RecordingTrainer(Trainer):  # type: ignore[misc]
    """Records the global step, the pass and the keys of every batch a training step computes on."""

    def __init__(self, *args: Any, passes: Passes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.passes = passes
        self.recorder = Recorder()

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.recorder.record(self.state.global_step, self.passes.epoch, inputs["kid"])
        return super().compute_loss(model, inputs, *args, **kwargs)


class TorchLoaderTrainer(RecordingTrainer):
    """The recipe: the Trainer trains from a shardcache TorchLoader (it does not prepare it)."""

    def __init__(self, *args: Any, shards: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shards = shards

    def get_train_dataloader(self) -> Any:
        return TorchLoader(
            dataset(self.shards),
            batch_size=self.args.per_device_train_batch_size,
            num_workers=self.args.dataloader_num_workers,
        )


def train(run: str, args: argparse.Namespace) -> None:
    setup = run.removesuffix("_resumed")
    resume = run.endswith("_resumed")
    out: Path = args.out / run
    training_args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=BATCH,
        dataloader_num_workers=WORKERS,
        max_steps=MAX_STEPS,
        use_cpu=True,
        report_to=[],
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_strategy="no",
        disable_tqdm=True,
        ddp_timeout=int(PG_TIMEOUT_S),
        learning_rate=1e-6,
        seed=0,
    )
    passes = Passes()
    common: dict[str, Any] = {"model": KeyModel(), "args": training_args, "passes": passes}
    trainer: RecordingTrainer
    if setup == "train_dataset":
        trainer = RecordingTrainer(train_dataset=dataset(args.shards), callbacks=[passes], **common)
    elif setup == "bare":
        trainer = TorchLoaderTrainer(shards=args.shards, callbacks=[passes], **common)
    else:
        from shardcache.transformers import ShardcacheCallback

        trainer = TorchLoaderTrainer(shards=args.shards, callbacks=[passes, ShardcacheCallback()], **common)
    completed = False
    error = None
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
        completed = True
    except Exception as exc:
        if run != "bare_resumed":
            raise
        error = f"{type(exc).__name__}: {exc}"
    finally:
        rank, world_size = training_args.process_index, training_args.world_size
        trainer.recorder.write(out, rank, world_size, completed=completed, error=error)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", required=True, help=f"comma-separated, in order: {', '.join(RUNS)}")
    parser.add_argument("--save-steps", type=int, default=27, help="checkpoint every K steps")
    args = parser.parse_args()
    for run in args.runs.split(","):
        if run not in RUNS:
            parser.error(f"unknown run {run!r}")
        train(run, args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
