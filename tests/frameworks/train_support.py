"""What the framework scripts share: the sample a training step sees, and the report each rank writes.

Imported by the scripts under tests/frameworks/ (launched with the repository root on PYTHONPATH), never by
the test modules: it imports torch and shardcache, and the scripts import the frameworks.

A sample's key travels as an integer tensor (`kid` = shard * KEY_BASE + index): Accelerate's dispatcher
concatenates and broadcasts batches as tensors and refuses strings, and the Hugging Face Trainer's default
collator stacks tensors only. `key_names` turns a batch's `kid` back into the keys the shards hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from shardcache import Dataset
from tests.frameworks.training_plan import BATCH, EPOCHS, KEY_BASE, PG_TIMEOUT_S, WORKERS

__all__ = ["BATCH", "EPOCHS", "PG_TIMEOUT_S", "WORKERS", "Recorder", "dataset", "key_names", "loss_of"]


def to_sample(sample: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors a step needs: the key as `kid`, and one input `x` (the sample's index in its shard)."""
    shard, index = (int(part) for part in str(sample["__key__"]).removeprefix("s").split("_"))
    meta = json.loads(sample["json"])
    assert (meta["shard"], meta["i"]) == (shard, index), f"{sample['__key__']} holds {meta}"
    return {"kid": torch.tensor(shard * KEY_BASE + index), "x": torch.tensor([float(index)])}


def key_names(kids: torch.Tensor) -> list[str]:
    """The keys of a batch's `kid` tensor, in batch order."""
    return [f"s{kid // KEY_BASE}_{kid % KEY_BASE}" for kid in kids.flatten().tolist()]


def dataset(shards: str) -> Dataset:
    """The training data as users write it: defaults everywhere (daemon="auto": SHARDCACHE_SOCKET decides)."""
    return Dataset.from_source("tars", shards).map(to_sample)


def loss_of(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A loss for the step to take (the data is what the tests check, not the model)."""
    y: torch.Tensor = layer(x)
    return ((y - x) ** 2).mean()


class Recorder:
    """Every batch a training step saw on this rank: its global step, its epoch and its keys."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.length: int | None = None  # the batches per epoch the framework planned (a loader's len())

    def record(self, step: int, epoch: int, kids: torch.Tensor) -> None:
        self.batches.append({"step": step, "epoch": epoch, "keys": key_names(kids)})

    def write(
        self, out: Path, rank: int, world_size: int, *, completed: bool, error: str | None = None
    ) -> None:
        """`<out>/rank<rank>.json`, written whole (a report is never half a file). A run that raised writes
        what its steps saw until then (`completed` false) and, where the script caught it, the `error`."""
        out.mkdir(parents=True, exist_ok=True)
        report = {
            "rank": rank,
            "world_size": world_size,
            "completed": completed,
            "error": error,
            "length": self.length,
            "batches": self.batches,
        }
        temp = out / f".rank{rank}.{os.getpid()}.tmp"
        temp.write_text(json.dumps(report))
        temp.replace(out / f"rank{rank}.json")
