"""One node of a PyTorch Lightning job on several nodes, launched as Lightning's docs launch one
(`harness.launches.lightning_nodes`): `python harness/lightning_nodes.py` on every node with MASTER_ADDR,
MASTER_PORT and that node's NODE_RANK; its "ddp" strategy starts the node's other ranks by running this
script again. Lightning sets NODE_RANK, LOCAL_RANK and WORLD_SIZE, not how many ranks a node runs.

Each rank trains a tiny model for --epochs epochs on `TorchLoader(ds, batch_size=8, num_workers=1)` over the
manifest's tar shards, read through its node's daemon (SHARDCACHE_SOCKET, daemon="required"), and writes
`<out>/rank<r>.json`: the node layout `RuntimeContext.from_runtime()` gives once training has started, and
the sample keys its training steps saw in each epoch.

    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NODE_RANK=1 python harness/lightning_nodes.py \
        --manifest shards.manifest.jsonl --out out/ --nodes 2 --devices 2
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy

from shardcache import Dataset, RuntimeContext, TorchLoader


def features(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample's key and one number (its index in its shard): what the step needs and records."""
    meta = json.loads(sample["json"])
    return {"key": sample["__key__"], "x": torch.tensor([float(meta["index"])])}


class KeyRecorder(pl.LightningModule):
    """nn.Linear(1, 1); every training step records its batch's keys under the epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epochs: list[list[str]] = []
        self.layout: list[int] = []

    def on_train_start(self) -> None:
        ctx = RuntimeContext.from_runtime()
        self.layout = [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank]
        self.layout.append(ctx.num_nodes)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        while len(self.epochs) <= self.current_epoch:
            self.epochs.append([])
        self.epochs[self.current_epoch] += list(batch["key"])
        x = batch["x"]
        loss: torch.Tensor = ((self.layer(x) - x) ** 2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--placement", default="auto")
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    args = parser.parse_args()
    ds = Dataset.from_source("tars", args.manifest, daemon="required", placement=args.placement)
    loader = TorchLoader(ds.map(features), batch_size=8, num_workers=1)
    model = KeyRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        # A short process-group timeout: a rank left waiting fails instead of hanging for 30 minutes.
        strategy=DDPStrategy(timeout=datetime.timedelta(seconds=args.pg_timeout)),
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"layout": model.layout, "epochs": model.epochs}
    (args.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
