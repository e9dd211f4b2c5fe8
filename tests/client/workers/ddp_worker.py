"""A plain DDP training loop over a shardcache TorchLoader, launched by torchrun from test_ddp_torchrun.py.

gloo process group, a tiny model in DistributedDataParallel, `TorchLoader(ds, num_workers, batch_size)`,
`set_epoch` per epoch, and NO `model.join()`: if one rank ran out of batches before the others, the
others would wait at their next gradient all-reduce until the process group's timeout (kept short here, so
the test fails instead of hanging for gloo's default 30 minutes).

Each rank writes `<out>/rank<r>.json`: for every mode and epoch, its step count and the keys it read (pads
marked), and the loader state when `--stop-after` cut the epoch short.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/client/workers/ddp_worker.py \
        --shards 'data/shard_{000..009}.tar' --out out/ --modes default --epochs 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardcache import Dataset, TorchLoader


def features(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample's key, pad flag and one number from its json: what the model and the test need."""
    meta = json.loads(sample["json"])
    return {"__key__": sample["__key__"], "pad": bool(sample.get("__pad__", False)), "x": float(meta["i"])}


def build(args: argparse.Namespace, mode: str) -> TorchLoader:
    options: dict[str, Any] = {} if mode == "default" else {"even": None if mode == "none" else mode}
    daemon: Any = args.daemon or None
    ds = Dataset.from_source("tars", args.shards, daemon=daemon, **options).map(features)
    return TorchLoader(ds, num_workers=args.workers, batch_size=args.batch)


def train_epoch(
    model: torch.nn.Module, optimiser: torch.optim.Optimizer, loader: TorchLoader, stop_after: int | None
) -> tuple[int, list[str]]:
    steps = 0
    keys: list[str] = []
    for batch in loader:
        x = batch["x"].float().unsqueeze(1)
        # A masked loss, as a trainer would write it: pad repeats take part in the step but not the loss.
        weight = (~batch["pad"]).float().unsqueeze(1)
        loss = ((model(x) - x) ** 2 * weight).sum() / weight.sum().clamp(min=1.0)
        optimiser.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here: every rank must take this step
        optimiser.step()
        keys += [
            k + ("#pad" if p else "") for k, p in zip(batch["__key__"], batch["pad"].tolist(), strict=True)
        ]
        steps += 1
        if stop_after is not None and steps == stop_after:
            break
    return steps, keys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default="default", help="comma-separated: default, drop, pad, none")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--daemon", default="", help="a daemon socket (default: no daemon)")
    parser.add_argument("--stop-after", type=int, default=None, help="stop epoch 0 after this many steps")
    parser.add_argument("--resume", type=Path, default=None, help="a JSON file of each rank's loader state")
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    parser.add_argument("--local-world-size", type=int, default=0, help="simulate nodes of this many ranks")
    args = parser.parse_args()
    if args.local_world_size:
        # What torchrun sets on each node of that size (its own values describe one node of all ranks).
        rank_in_job, size = int(os.environ["RANK"]), args.local_world_size
        os.environ["LOCAL_WORLD_SIZE"] = str(size)
        os.environ["LOCAL_RANK"] = str(rank_in_job % size)
        os.environ["GROUP_RANK"] = str(rank_in_job // size)
        os.environ["GROUP_WORLD_SIZE"] = str(int(os.environ["WORLD_SIZE"]) // size)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-6)
    report: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size(), "modes": {}}
    for mode in args.modes.split(","):
        loader = build(args, mode)
        if args.resume is not None:
            loader.load_state_dict(json.loads(args.resume.read_text())[str(rank)])
        epochs = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            steps, keys = train_epoch(model, optimiser, loader, args.stop_after if epoch == 0 else None)
            entry: dict[str, Any] = {"steps": steps, "keys": keys}
            if args.stop_after is not None and epoch == 0:
                entry["state"] = loader.state_dict()
            epochs.append(entry)
        report["modes"][mode] = epochs
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
