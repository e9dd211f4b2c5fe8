"""The toy task of the framework examples: small tar shards with manifests, a one-weight model, and a record
of what every training and evaluation step saw.

    python examples/frameworks/toy.py /tmp/toy      # writes /tmp/toy/{train,val}/ and their manifests

Every sample is `{"x": i}` (its index in its shard), keyed `s<shard>_<i>`; the model learns y = 2x + 1. The
manifests (`shardcache manifest` writes the same) give every shard's sample count, which `len()` of a
TorchLoader and `even=` need. Run an example with `--trace DIR` to get, per rank, the keys each step saw
(`StepTrace`): what `tests/frameworks/` checks, and a way to compare two runs of your own.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import torch

from shardcache import write_manifest

# Samples per shard: unequal, so no rank's share is a whole number of batches.
TRAIN_SHARDS = (35, 44, 38, 41, 36, 43, 37, 41)
VAL_SHARDS = (13, 17, 11)
KEY_BASE = 1000  # a key travels as the integer shard * KEY_BASE + index (tensors only, through collation)


def write_dataset(root: Path) -> Path:
    """The toy train and validation sets under `root` (`<root>/train.manifest.jsonl`, ...); `root`."""
    for split, shards in (("train", TRAIN_SHARDS), ("val", VAL_SHARDS)):
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        for s, count in enumerate(shards):
            with tarfile.open(folder / f"shard_{s}.tar", "w") as tar:
                for i in range(count):
                    data = json.dumps({"x": i}).encode()
                    info = tarfile.TarInfo(f"s{s}_{i}.json")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        write_manifest(str(folder / "shard_*.tar"), root / f"{split}.manifest.jsonl")
    return root


def decode(sample: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A sample as tensors: its key as `kid`, input `x`, target `y`, and `valid` (False for the repeats an
    evaluation dataset adds to even out the ranks, marked `__pad__`)."""
    shard, index = (int(part) for part in str(sample["__key__"]).removeprefix("s").split("_"))
    x = float(json.loads(sample["json"])["x"])
    return {
        "kid": torch.tensor(shard * KEY_BASE + index),
        "x": torch.tensor([x]),
        "y": torch.tensor([2 * x + 1]),
        "valid": torch.tensor(not sample.get("__pad__", False)),
    }


class Tiny(torch.nn.Module):
    """y = a x + b."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        return out


def squared_errors(prediction: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-sample squared error; a repeat (`valid` False) counts 0."""
    return ((prediction - batch["y"]) ** 2).squeeze(1) * batch["valid"]


class StepTrace:
    """What each step saw on this rank, written as `<folder>/rank<r>.json` (nothing without a folder)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.length: int | None = None  # len() of the training loader, as the example asked it
        self.train: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []

    def train_step(self, step: int, batch: dict[str, torch.Tensor], epoch: int | None = None) -> None:
        """A training batch at global step `step` (in the framework's `epoch`, where it numbers them)."""
        self.train.append({"step": step, "epoch": epoch, "keys": _keys(batch)})

    def begin_eval(self, at_step: int) -> None:
        """An evaluation run starts, after training step `at_step`."""
        self.evals.append({"at_step": at_step, "keys": [], "valid": []})

    def eval_step(self, batch: dict[str, torch.Tensor]) -> None:
        """A batch of the evaluation run begun last."""
        self.evals[-1]["keys"].extend(_keys(batch))
        self.evals[-1]["valid"].extend(batch["valid"].flatten().tolist())

    def write(self, rank: int, world_size: int, *, completed: bool) -> None:
        if self.folder is None:
            return
        folder = Path(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        report = {"rank": rank, "world_size": world_size, "completed": completed, "length": self.length}
        temp = folder / f".rank{rank}.{os.getpid()}.tmp"
        temp.write_text(json.dumps({**report, "train": self.train, "evals": self.evals}))
        temp.replace(folder / f"rank{rank}.json")


def _keys(batch: dict[str, torch.Tensor]) -> list[str]:
    return [f"s{kid // KEY_BASE}_{kid % KEY_BASE}" for kid in batch["kid"].flatten().tolist()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write the toy dataset of the framework examples")
    parser.add_argument("root", type=Path)
    print(write_dataset(parser.parse_args().root))
