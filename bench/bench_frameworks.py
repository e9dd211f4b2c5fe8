"""Samples/s of each framework's training loop over a TorchLoader, against the same loop over a plain
DataLoader on the same tar files (`python -m bench.bench_frameworks`).

The loops are Lightning's `Trainer.fit`, a hand-written Accelerate loop after `accelerator.prepare`, and
the Hugging Face `Trainer` (a TorchLoader from `get_train_dataloader`, as docs/frameworks.md recommends).
The baseline is what a user writes without shardcache: a torch `IterableDataset` that splits the tar files
by DataLoader worker and reads them with `tarfile`, in a `torch.utils.data.DataLoader` with the same batch
size and workers. One process, one CPU device, a linear model: the figure is the framework's loop plus the
loader, which is what the recipe could slow down. Each pair runs interleaved, in one process; the ratio is
TorchLoader / plain (above 1: the recipe is faster).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardcache import Dataset, TorchLoader

FEATURES = 64


def write_shards(root: Path, shards: int, samples: int) -> list[str]:
    paths = []
    for s in range(shards):
        path = root / f"shard_{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(samples):
                payload = np.full(FEATURES, s * samples + i, dtype=np.float32).tobytes()
                info = tarfile.TarInfo(f"s{s:04d}_{i:05d}.npy")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        paths.append(str(path))
    return paths


class PlainTars(IterableDataset[dict[str, Any]]):
    """The hand-written baseline: every worker reads its share of the files with tarfile."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        mine = self.paths if info is None else self.paths[info.id :: info.num_workers]
        for path in mine:
            with tarfile.open(path) as tar:
                for member in tar:
                    handle = tar.extractfile(member)
                    assert handle is not None
                    yield {"npy": handle.read()}


def collate(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    rows = np.stack([np.frombuffer(sample["npy"], dtype=np.float32) for sample in batch])
    return {"x": torch.from_numpy(rows)}


def loaders(paths: list[str], batch: int, workers: int) -> dict[str, Callable[[], Any]]:
    def torch_loader() -> Any:
        ds = Dataset.from_source("tars", paths, daemon=None)
        return TorchLoader(ds, batch_size=batch, num_workers=workers, collate_fn=collate)

    def plain() -> Any:
        return DataLoader(
            PlainTars(paths),
            batch_size=batch,
            num_workers=workers,
            collate_fn=collate,
            persistent_workers=True,
        )

    return {"TorchLoader": torch_loader, "plain DataLoader": plain}


def run_lightning(make: Callable[[], Any], epochs: int) -> int:
    import pytorch_lightning as pl

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, 1)
            self.samples = 0

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            self.samples += len(batch["x"])
            loss: torch.Tensor = self.layer(batch["x"]).mean()
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.001)

    model = Model()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=make())
    return model.samples


def run_accelerate(make: Callable[[], Any], epochs: int) -> int:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    layer = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.001)
    layer, optimizer, loader = accelerator.prepare(layer, optimizer, make())
    samples = 0
    for _ in range(epochs):
        for batch in loader:
            loss = layer(batch["x"]).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            samples += len(batch["x"])
    return samples


def run_trainer(make: Callable[[], Any], epochs: int, steps: int) -> int:
    from transformers import Trainer, TrainingArguments

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, 1)
            self.samples = 0

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            self.samples += len(x)
            return {"loss": self.layer(x).mean()}

    class LoaderTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return make()

    model = Model()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=1,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
        )
        LoaderTrainer(model=model, args=args).train()
    return model.samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples", type=int, default=500, help="samples per shard")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--frameworks", default="lightning,accelerate,trainer")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_shards(Path(tmp), args.shards, args.samples)
        steps = args.epochs * args.shards * args.samples // args.batch
        runners: dict[str, Callable[[Callable[[], Any]], int]] = {
            "lightning": lambda make: run_lightning(make, args.epochs),
            "accelerate": lambda make: run_accelerate(make, args.epochs),
            "trainer": lambda make: run_trainer(make, args.epochs, steps),
        }
        results: dict[str, dict[str, float]] = {}
        for name in args.frameworks.split(","):
            rates: dict[str, float] = {}
            # A first round warms imports and the page cache; the second, interleaved, is the figure.
            for _ in range(2):
                for kind, make in loaders(paths, args.batch, args.workers).items():
                    started = time.perf_counter()
                    samples = runners[name](make)
                    rates[kind] = samples / (time.perf_counter() - started)
            results[name] = rates
            ratio = rates["TorchLoader"] / rates["plain DataLoader"]
            print(
                f"{name:<11} TorchLoader {rates['TorchLoader']:>8.0f} samples/s   plain DataLoader "
                f"{rates['plain DataLoader']:>8.0f} samples/s   ratio {ratio:.2f}",
                flush=True,
            )
        print(json.dumps(results))


if __name__ == "__main__":
    main()
