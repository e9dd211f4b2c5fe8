"""TorchLoader's own cost: worker start per epoch under each start method, and main-process CPU per batch.

1. **Worker start per epoch.** Tiny shards, so an epoch is almost all worker start: one rank, two
   workers, `--epochs` epochs under fork, forkserver and spawn, with persistent workers (the default) and
   without. Prints the first epoch's seconds and the mean of the later ones; with persistent workers the
   later epochs start no process.
2. **Main-process CPU per batch.** The trainer's main thread launches the GPU kernels, so what the loader
   costs there is training time (target: at most 1.1x a plain DataLoader). The same Dataset and workers
   through `torch.utils.data.DataLoader` and through `TorchLoader` (its rotation merge, resume
   bookkeeping, stall watchdog and telemetry to a running daemon), measured with `time.process_time()` of
   the main process over the same batches; the ratio is in one run, alternating, best of `--repeats`.

    python -m bench.bench_loader            # full sizes (docs/benchmarks.md)
    python -m bench.bench_loader --quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.utils.data as data

from bench.bench_pipeline import make_shards
from harness.devservers import start_daemon
from shardcache import Dataset, TorchLoader

METHODS = ("fork", "forkserver", "spawn")


def epoch_seconds(ds: Dataset, method: str, persistent: bool, epochs: int) -> list[float]:
    loader = TorchLoader(
        ds, num_workers=2, batch_size=8, multiprocessing_context=method, persistent_workers=persistent
    )
    times = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        started = time.perf_counter()
        for _ in loader:
            pass
        times.append(time.perf_counter() - started)
    loader.close()
    return times


def worker_start(root: Path, epochs: int) -> None:
    (root / "tiny").mkdir()
    shards = make_shards(root / "tiny", 4, 16, 64)
    ds = Dataset.from_source("tars", shards, daemon=None)
    print(f"worker start: 1 rank x 2 workers, {epochs} epochs of 64 samples (seconds per epoch)")
    print(f"{'start method':<12} {'persistent':<11} {'first epoch':>12} {'later epochs':>13}")
    for method in METHODS:
        for persistent in (True, False):
            times = epoch_seconds(ds, method, persistent, epochs)
            later = statistics.mean(times[1:])
            print(f"{method:<12} {str(persistent):<11} {times[0]:>12.3f} {later:>13.3f}")


def main_cpu(ds: Dataset, batches: int, plain: bool) -> float:
    """Main-process CPU seconds per batch over `batches` batches (after the workers started)."""
    if plain:
        dataset: Any = ds  # an IterableDataset by registration (see shardcache.dataset); mypy cannot see it
        loader: Any = data.DataLoader(dataset, num_workers=2, batch_size=8, persistent_workers=True)
    else:
        loader = TorchLoader(ds, num_workers=2, batch_size=8)
    iterator = iter(loader)
    next(iterator)  # the workers are up and delivering
    started = time.process_time()
    seen = 0
    for _ in iterator:
        seen += 1
        if seen == batches:
            break
    spent = time.process_time() - started
    if not plain:
        loader.close()
    return spent / seen


def main_process_cpu(root: Path, batches: int, repeats: int) -> None:
    (root / "cpu").mkdir()
    shards = make_shards(root / "cpu", 16, 2000, 256)
    daemon = start_daemon(root / "d.sock", root / "cache", [str(root)], capacity="1GiB")
    try:
        ds = Dataset.from_source("tars", shards, daemon=daemon.socket)
        plain, ours = [], []
        for _ in range(repeats):
            plain.append(main_cpu(ds, batches, plain=True))
            ours.append(main_cpu(ds, batches, plain=False))
    finally:
        daemon.stop()
    best_plain, best_ours = min(plain), min(ours)
    print(f"\nmain-process CPU per batch (8 samples of 256 B, 2 workers, daemon running), best of {repeats}")
    print(f"plain DataLoader   {best_plain * 1e6:8.1f} us")
    print(f"TorchLoader        {best_ours * 1e6:8.1f} us")
    print(f"ratio              {best_ours / best_plain:8.2f}x (target <= 1.1x)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.batches, args.repeats = 2, 200, 1
    with tempfile.TemporaryDirectory(prefix="sc-", dir="/tmp") as tmp:
        worker_start(Path(tmp), args.epochs)
        main_process_cpu(Path(tmp), args.batches, args.repeats)


if __name__ == "__main__":
    main()
