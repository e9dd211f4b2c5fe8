"""The Hugging Face Trainer: train, evaluate every epoch, resume from a checkpoint wherever it lies.

    python examples/frameworks/toy.py /tmp/toy
    torchrun --nproc_per_node 2 examples/frameworks/hf_trainer.py --data /tmp/toy --out /tmp/hf-run
    torchrun --nproc_per_node 2 examples/frameworks/hf_trainer.py --data /tmp/toy --out /tmp/hf-run \\
        --resume /tmp/hf-run/checkpoint-27

The Trainer trains from a TorchLoader (`get_train_dataloader`; the Trainer does not prepare it), whose
length lets `num_train_epochs` plan the run. `ShardcacheCallback` writes every rank's position into each
checkpoint's `trainer_state.json` and loads it from the checkpoint `resume_from_checkpoint` names. The
evaluation loader reads an evaluation dataset: every rank takes the same number of steps (the Trainer
gathers every step), and `compute_metrics` leaves out the repeats that even out the ranks (`valid`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from toy import StepTrace, Tiny, decode, squared_errors
from transformers import EvalPrediction, Trainer, TrainingArguments

from shardcache import Dataset, TorchLoader
from shardcache.transformers import ShardcacheCallback


class ToyModel(torch.nn.Module):
    """The Trainer's calling convention: the batch's fields as keyword arguments, {"loss": ...} out."""

    def __init__(self) -> None:
        super().__init__()
        self.tiny = Tiny()

    def forward(self, x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor, kid: torch.Tensor) -> Any:
        prediction = self.tiny(x)
        errors = squared_errors(prediction, {"y": y, "valid": valid})
        return {"loss": errors.sum() / valid.sum().clamp(min=1), "prediction": prediction}


class ShardcacheTrainer(Trainer):  # type: ignore[misc]
    def __init__(self, *args: Any, trace: StepTrace, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace = trace

    def get_train_dataloader(self) -> TorchLoader:
        args = self.args
        loader = TorchLoader(
            self.train_dataset,
            batch_size=args.per_device_train_batch_size,
            num_workers=args.dataloader_num_workers,
        )
        self.trace.length = len(loader)  # steps per epoch on this rank: what num_train_epochs plans with
        return loader

    def get_eval_dataloader(self, eval_dataset: Any = None) -> TorchLoader:
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        args = self.args
        return TorchLoader(
            dataset, batch_size=args.per_device_eval_batch_size, num_workers=args.dataloader_num_workers
        )

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        if model.training:
            self.trace.train_step(self.state.global_step, inputs)
        else:
            self.trace.eval_step(inputs)
        return super().compute_loss(model, inputs, *args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        self.trace.begin_eval(self.state.global_step)
        metrics: dict[str, float] = super().evaluate(*args, **kwargs)
        return metrics


def masked_mse(prediction: EvalPrediction) -> dict[str, float]:
    """Mean squared error over the evaluation set, the repeats that even out the ranks left out."""
    y, valid = prediction.label_ids
    errors = ((prediction.predictions - y) ** 2).squeeze(1) * valid
    return {"mse": float(errors.sum() / valid.sum())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="the folder toy.py wrote")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=27, help="a checkpoint every N training steps")
    parser.add_argument("--resume", help="a checkpoint folder (checkpoint-<step>), wherever it lies")
    parser.add_argument("--trace", help="write the keys each step saw to TRACE/rank<r>.json")
    args = parser.parse_args()

    train = Dataset.from_source("tars", str(args.data / "train.manifest.jsonl")).shuffle(64).map(decode)
    val = Dataset.from_source("tars", str(args.data / "val.manifest.jsonl")).map(decode)
    training_args = TrainingArguments(
        output_dir=str(args.out),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        dataloader_num_workers=2,
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=args.save_every,
        label_names=["y", "valid"],  # handed to compute_metrics as label_ids
        learning_rate=0.05,
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(),
        ddp_timeout=60,  # a stuck rank fails instead of waiting for 30 minutes
        report_to=[],
        disable_tqdm=True,
    )
    trace = StepTrace(args.trace)
    trainer = ShardcacheTrainer(
        model=ToyModel(),
        args=training_args,
        train_dataset=train,
        eval_dataset=val.for_evaluation(),
        compute_metrics=masked_mse,
        callbacks=[ShardcacheCallback()],
        trace=trace,
    )
    completed = False
    try:
        trainer.train(resume_from_checkpoint=args.resume)
        completed = True
    finally:
        trace.write(training_args.process_index, training_args.world_size, completed=completed)


if __name__ == "__main__":
    main()
