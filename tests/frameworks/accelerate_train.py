"""Hugging Face Accelerate trains a tiny model on two CPU ranks from shardcache data, launched by torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/frameworks/accelerate_train.py \
        --shards 'data/shard_{0..7}.tar' --out out/ --runs torchloader,dispatch,shard

A plain loop over epochs, as Accelerate's docs write it (`for epoch in ...: for batch in loader:`), with
no `set_epoch` call of the user's. Each step records its keys. The runs of `--runs` go one after the other
in the same two processes, each with a new Accelerator, model and loader; after each, every rank writes
`<out>/<run>/rank<r>.json`.

Runs:
- torchloader: `accelerator.prepare(model, opt, TorchLoader(ds, batch_size=8, num_workers=2))`.
- dispatch: `accelerator.prepare(model, opt, DataLoader(ds, batch_size=8, num_workers=2))`, the default
  configuration (Accelerate makes it a DataLoaderDispatcher: rank 0 reads, every rank gets a slice).
- shard: the same with `DataLoaderConfiguration(dispatch_batches=False)` (IterableDatasetShard).

The resume recipe (`save_state`/`load_state`) is `examples/frameworks/accelerate_loop.py`, which
`tests/frameworks/test_examples.py` runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs

from shardcache import TorchLoader
from tests.frameworks.train_support import (
    BATCH,
    EPOCHS,
    PG_TIMEOUT_S,
    WORKERS,
    Recorder,
    dataset,
    loss_of,
)

RUNS = ("torchloader", "dispatch", "shard")


def accelerator_for(run: str) -> Accelerator:
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    config = DataLoaderConfiguration(dispatch_batches=False) if run == "shard" else None
    return Accelerator(cpu=True, kwargs_handlers=[timeout], dataloader_config=config)


def loader_for(run: str, shards: str) -> Any:
    ds = dataset(shards)
    if run == "torchloader":
        return TorchLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    return torch.utils.data.DataLoader(
        # a torch IterableDataset at run time (registered), not to a type checker
        ds,  # type: ignore[arg-type]
        batch_size=BATCH,
        num_workers=WORKERS,
    )


def train(run: str, args: argparse.Namespace) -> None:
    accelerator = accelerator_for(run)
    torch.manual_seed(0)
    layer = torch.nn.Linear(1, 1)
    optimiser = torch.optim.SGD(layer.parameters(), lr=1e-6)
    model, optimiser, loader = accelerator.prepare(layer, optimiser, loader_for(run, args.shards))
    recorder = Recorder()
    completed = False
    step = 0
    try:
        for epoch in range(EPOCHS):
            for batch in loader:
                recorder.record(step, epoch, batch["kid"])
                optimiser.zero_grad()
                accelerator.backward(loss_of(model, batch["x"]))
                optimiser.step()
                step += 1
        completed = True
    finally:
        recorder.write(
            args.out / run, accelerator.process_index, accelerator.num_processes, completed=completed
        )
    accelerator.wait_for_everyone()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", required=True, help=f"comma-separated, in order: {', '.join(RUNS)}")
    args = parser.parse_args()
    for run in args.runs.split(","):
        if run not in RUNS:
            parser.error(f"unknown run {run!r}")
        train(run, args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
