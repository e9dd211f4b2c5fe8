"""Hugging Face Accelerate: a training loop with save_state/load_state and an evaluation with
gather_for_metrics, from shardcache.

    python examples/frameworks/toy.py /tmp/toy
    torchrun --nproc_per_node 2 examples/frameworks/accelerate_loop.py --data /tmp/toy --out /tmp/acc-run
    torchrun --nproc_per_node 2 examples/frameworks/accelerate_loop.py --data /tmp/toy --out /tmp/acc-run \\
        --resume /tmp/acc-run/checkpoints/step_27

`accelerator.prepare` hands a TorchLoader back unchanged: each rank reads its own share through the node's
daemon, and the batches stay on the CPU until the loop moves them. The loader and the loop's progress are
registered for checkpointing, so `save_state` holds every rank's position and `load_state` goes on from it
exactly, in the middle of an epoch too. Evaluation reads an evaluation dataset: every rank takes the same
number of steps (a collective per step is safe), and the repeats that even out the ranks are masked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator
from toy import StepTrace, Tiny, decode, squared_errors

from shardcache import Dataset, TorchLoader


class Progress:
    """Where the loop is: saved and loaded with the checkpoint, like every registered object."""

    def __init__(self) -> None:
        self.epoch, self.step = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


def evaluate(
    accelerator: Accelerator, model: torch.nn.Module, loader: TorchLoader, trace: StepTrace
) -> float:
    """Mean squared error over the evaluation set, the repeats that even out the ranks left out."""
    model.eval()
    total = torch.zeros(2)  # squared errors, samples (repeats left out)
    with torch.no_grad():
        for batch in loader:
            trace.eval_step(batch)
            batch = {name: value.to(accelerator.device) for name, value in batch.items()}
            errors = squared_errors(model(batch["x"]), batch)
            errors, valid = accelerator.gather_for_metrics((errors, batch["valid"]))
            total += torch.stack([errors.sum(), valid.sum()]).cpu()
    model.train()
    return float(total[0] / total[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="the folder toy.py wrote")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=27, help="save_state every N training steps")
    parser.add_argument("--resume", type=Path, help="a folder save_state wrote")
    parser.add_argument("--trace", help="write the keys each step saw to TRACE/rank<r>.json")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # without a GPU: one job of CPU processes
    train = Dataset.from_source("tars", str(args.data / "train.manifest.jsonl")).shuffle(64).map(decode)
    val = Dataset.from_source("tars", str(args.data / "val.manifest.jsonl")).map(decode)
    # state_scope="job": save_state writes rank 0's objects only, so the state holds every rank's position.
    train_loader = TorchLoader(train, batch_size=8, num_workers=2, state_scope="job")
    val_loader = TorchLoader(val.for_evaluation(), batch_size=8, num_workers=2)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)  # loader unchanged
    progress = Progress()
    accelerator.register_for_checkpointing(train_loader, progress)
    if args.resume is not None:
        accelerator.load_state(str(args.resume))

    trace = StepTrace(args.trace)
    trace.length = len(train_loader)  # steps per epoch on this rank (schedulers and progress bars use it)
    completed = False
    try:
        for epoch in range(progress.epoch, args.epochs):
            progress.epoch = epoch
            for batch in train_loader:  # a mid-epoch resume goes on inside its epoch
                trace.train_step(progress.step, batch, epoch)
                batch = {name: value.to(accelerator.device) for name, value in batch.items()}
                loss = squared_errors(model(batch["x"]), batch).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                progress.step += 1
                if progress.step % args.save_every == 0:  # every rank calls it: the state is gathered
                    accelerator.save_state(str(args.out / "checkpoints" / f"step_{progress.step}"))
            trace.begin_eval(progress.step)
            mse = evaluate(accelerator, model, val_loader, trace)
            accelerator.print(f"epoch {epoch}: validation mse {mse:.4f}")
        completed = True
    finally:
        trace.write(accelerator.process_index, accelerator.num_processes, completed=completed)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
