"""TorchLoader's thread workers against its worker processes (today's default), measured in the same run.

Each workload runs the same pipeline through `TorchLoader(num_workers=2)` with `workers="processes"` (the
baseline) and `workers="threads"`, alternating, `--repeats` times, best run of each; the main process alone
(`num_workers=0`) is printed for reference. Rates are samples per wall second and samples per CPU-second of
every process (the trainer's threads and its reaped worker processes: `resource.getrusage`).

1. **light**: 24 tar shards of 384 samples x 32 KiB, direct reads (warm page cache), `shuffle(1024)`, a decode
   map to (id, label, uint8 array), collated to tensors in batches of 32, two epochs. Target: threads >= 3x
   samples/s and >= 3x samples per CPU-second.
2. **daemon**: the same through a running `shardcached`, 2 ranks (processes) x 2 workers each, as the demo
   runs. Target: threads >= 2x samples/s.
3. **jpeg**: 500x375 JPEGs, `shardcache.images.decode(..., backend="turbo")` (decode + random-resized-crop to
   224), batches of 32. Target: threads >= 1.0x processes.
4. **gil**: the light pipeline plus a user's map holding the GIL (a pure-Python loop over 1 KiB per
   sample). Target: processes with the ring >= 1.3x today's; it says when threads lose.
5. **memory**: the light pipeline's trainer RSS plus its workers' USS (private pages) midway through the
   second epoch, each loader in a fresh trainer process (a process that ran another loader before keeps
   its heap). Target: threads <= 0.5x.

    .venv/bin/python -m bench.bench_threads             # full sizes (docs/benchmarks.md)
    .venv/bin/python -m bench.bench_threads --quick
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import resource
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardcache import Dataset, RuntimeContext, TorchLoader

# name -> (workers, shared_ring): today's worker processes (torch's own hand-over) are the baseline.
MODES = {
    "processes (today)": ("processes", False),
    "processes + ring": ("processes", True),
    "threads": ("threads", True),
}
BASELINE = "processes (today)"
MODES_KWARGS: dict[str, dict[str, Any]] = {
    **{name: {"workers": workers, "shared_ring": ring} for name, (workers, ring) in MODES.items()},
    "main process": {},
}


@dataclass
class Run:
    samples: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.samples / self.cpu_s


def write_shards(root: Path, shards: int, samples: int, payload: int) -> list[str]:
    """Tar shards of `samples` samples each: a `payload`-byte body and a JSON label per sample."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = root / f"shard_{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                key = f"{s:04d}_{i:06d}"
                for field, data in (
                    ("bin", os.urandom(payload)),
                    ("json", json.dumps({"label": i % 10}).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def write_jpegs(root: Path, shards: int, samples: int) -> list[str]:
    from bench.bench_decode import picture

    root.mkdir(parents=True, exist_ok=True)
    pictures = [picture(500, 375, seed) for seed in range(16)]
    paths = []
    for s in range(shards):
        path = root / f"shard_{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                data = pictures[(s * samples + i) % len(pictures)]
                info = tarfile.TarInfo(f"{s:04d}_{i:06d}.jpg")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def decode(sample: dict[str, Any]) -> tuple[int, int, np.ndarray]:
    key = str(sample["__key__"])
    label = json.loads(sample["json"])["label"]
    return int(key.replace("_", "")), int(label), np.frombuffer(sample["bin"], dtype=np.uint8).copy()


def python_loop(sample: tuple[int, int, np.ndarray]) -> tuple[int, int, np.ndarray]:
    """A user's map that holds the GIL: a pure-Python checksum over 1 KiB of the decoded sample."""
    key, label, pixels = sample
    total = 0
    for byte in pixels[:1024].tobytes():
        total = (total * 31 + byte) & 0xFFFFFFFF
    return key, label ^ (total & 1), pixels


def light(paths: list[str], socket: str | None = None, ctx: RuntimeContext | None = None) -> Dataset:
    return Dataset.from_source("tars", paths, daemon=socket, context=ctx).shuffle(1024).map(decode)


def jpeg(paths: list[str]) -> Dataset:
    from shardcache import images

    stage = images.decode("jpg", 224, backend="turbo", seed=0)
    return Dataset.from_source("tars", paths, daemon=None).map(stage).map(lambda s: s["jpg"])


def gil(paths: list[str]) -> Dataset:
    return light(paths).map(python_loop)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def private_mb(pid: int) -> float:
    """A process's unique set size (private pages), MB."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children() -> list[int]:
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append(int(stat.parent.name))
    return found


def memory_parts() -> tuple[float, list[float]]:
    """The trainer's RSS and every worker process's USS, MB."""
    workers = [private_mb(pid) for pid in children() if Path(f"/proc/{pid}/smaps_rollup").exists()]
    return rss_mb(), workers


def memory_main(args: tuple[list[str], str, int, Any]) -> None:
    """In a fresh trainer process: one loader's memory midway through its second epoch."""
    paths, mode, num_workers, out = args
    parts: list[tuple[float, list[float]]] = []
    loader = TorchLoader(light(paths), num_workers=num_workers, batch_size=32, **MODES_KWARGS[mode])
    for epoch in range(2):
        loader.set_epoch(epoch)
        for step, _ in enumerate(loader):
            if epoch == 1 and step == 100:
                parts.append(memory_parts())
    loader.close()
    out.put(parts[0])


def memory(paths: list[str], repeats: int) -> None:
    """Trainer RSS + workers' USS per loader, each in a fresh (spawned) trainer that forks its workers."""
    spawn = multiprocessing.get_context("spawn")
    found: dict[str, list[tuple[float, list[float]]]] = {mode: [] for mode in (*MODES, "main process")}
    for _ in range(repeats):
        for mode in found:
            out = spawn.SimpleQueue()
            process = spawn.Process(
                target=memory_main, args=((paths, mode, 0 if mode == "main process" else 2, out),)
            )
            process.start()
            found[mode].append(out.get())
            process.join()
    print(
        f"\nmemory (light pipeline, trainer RSS + workers' USS midway through epoch 2), median of {repeats}"
    )
    totals = {mode: statistics.median(t + sum(w) for t, w in runs) for mode, runs in found.items()}
    base = totals[BASELINE]
    for mode, runs in found.items():
        trainer, workers = sorted(runs, key=lambda r: r[0] + sum(r[1]))[len(runs) // 2]
        uss = " + ".join(f"{w:.0f}" for w in workers) or "-"
        label = "num_workers=0" if mode == "main process" else f"2 workers, {mode}"
        print(
            f"  {label:<30}{totals[mode]:>8.0f} MB{totals[mode] / base:>6.2f}x"
            f"   (trainer {trainer:.0f} MB, workers' USS {uss} MB)"
        )


def measure(
    make: Callable[[], Dataset], mode: str, num_workers: int, epochs: int, batch: int = 32, **kwargs: Any
) -> Run:
    """One loader over `epochs` epochs: samples, wall and CPU seconds (memory midway through the last)."""
    loader = TorchLoader(make(), num_workers=num_workers, batch_size=batch, **MODES_KWARGS[mode], **kwargs)
    cpu0, children0, started = time.process_time(), children_cpu(), time.perf_counter()
    samples = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for item in loader:
            samples += len(item[0]) if isinstance(item, (list, tuple)) else len(item)
    loader.close()  # joins the worker processes: their CPU is in RUSAGE_CHILDREN from here
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0 + children_cpu() - children0
    return Run(samples, wall, cpu)


def compare(
    name: str, make: Callable[[], Dataset], epochs: int, repeats: int, main: bool = True
) -> dict[str, Run]:
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    if main:
        runs["main process"] = []
    for r in range(repeats):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for mode in order:
            runs[mode].append(measure(make, mode, 0 if mode == "main process" else 2, epochs))
    best = {mode: max(found, key=lambda run: run.per_s) for mode, found in runs.items()}
    base = best[BASELINE]
    print(f"\n{name}: best of {repeats}, {base.samples} samples per run")
    print(f"  {'loader':<30}{'samples/s':>11}{'x':>7}{'samples/CPU-s':>15}{'x':>7}")
    for mode, run in best.items():
        label = "num_workers=0" if mode == "main process" else f"2 workers, {mode}"
        print(
            f"  {label:<30}{run.per_s:>11,.0f}{run.per_s / base.per_s:>6.2f}x"
            f"{run.per_cpu_s:>15,.0f}{run.per_cpu_s / base.per_cpu_s:>6.2f}x"
        )
    return best


def rank_main(args: tuple[list[str], str, int, str, int, Any]) -> None:
    paths, socket, rank, mode, epochs, out = args
    ctx = RuntimeContext(rank=rank, world_size=2, seed=0)
    # A spawned rank would spawn its worker processes too (each importing torch); the demo forks them.
    run = measure(lambda: light(paths, socket, ctx), mode, 2, epochs, multiprocessing_context="fork")
    out.put((run.samples, run.wall_s))


def through_daemon(paths: list[str], root: Path, epochs: int, repeats: int) -> None:
    """2 ranks x 2 workers through a real daemon: samples/s of the job (both ranks' samples over the
    slower rank's loop, each rank timed from its loader's start, after its imports)."""
    from harness.devservers import start_daemon

    daemon = start_daemon(root / "d.sock", root / "cache", [str(root)], capacity="2GiB")
    spawn = multiprocessing.get_context("spawn")  # ranks are separate trainers, as torchrun starts them
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for r in range(repeats):
            for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                out = spawn.SimpleQueue()
                ranks = [
                    spawn.Process(target=rank_main, args=((paths, daemon.socket, rank, mode, epochs, out),))
                    for rank in range(2)
                ]
                for process in ranks:
                    process.start()
                done = [out.get() for _ in ranks]
                for process in ranks:
                    process.join()
                rates[mode].append(sum(samples for samples, _ in done) / max(wall for _, wall in done))
    finally:
        daemon.stop()
    base = max(rates[BASELINE])
    print(f"\ndaemon, 2 ranks x 2 workers (job samples/s), best of {repeats}")
    for mode in MODES:
        print(f"  2 workers, {mode:<19}{max(rates[mode]):>11,.0f}{max(rates[mode]) / base:>6.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--only", default="light,daemon,jpeg,gil,memory", help="comma-separated workloads")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    shards, samples = (24, 384) if not args.quick else (8, 128)
    only = set(args.only.split(","))
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="sc-", dir="/tmp") as tmp:
        root = Path(tmp)
        paths = write_shards(root / "light", shards, samples, 32 * 1024)
        for path in paths:  # warm page cache
            Path(path).read_bytes()
        if "light" in only:
            compare(
                "light (32 KiB samples, 1 rank, direct reads)",
                lambda: light(paths),
                args.epochs,
                args.repeats,
            )
        if "daemon" in only:
            through_daemon(paths, root, args.epochs, args.repeats)
        if "jpeg" in only:
            jpegs = write_jpegs(root / "jpeg", 8 if not args.quick else 2, 128)
            compare(
                "jpeg (500x375, turbo decode + crop to 224)", lambda: jpeg(jpegs), 1, args.repeats, main=False
            )
        if "memory" in only:
            memory(paths, args.repeats)
        if "gil" in only:
            compare("gil (pure-Python loop per sample)", lambda: gil(paths), 1, args.repeats, main=False)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
