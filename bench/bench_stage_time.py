"""What stage-time accounting costs: samples/s with it on and off, in the same run (issue 27).

Two pipelines over the same tar shards, iterated in this process (no workers, no daemon: the accounting
is all the overhead there is to see):

- realistic: tar read, a map decoding the sample's JPEG with Pillow (`--size`, default 256x192, smaller
  than ImageNet's ~500x375 so the decode does not hide the accounting), shuffle(1024), batch(64);
- trivial: tar read, a map touching one field, shuffle(1024), batch(64): the accounting's worst case, a
  few microseconds of work per sample.

On and off alternate in every round (`SHARDCACHE_STAGE_TIMES=0` is the off switch, read when a pass
starts); the median over rounds of on/off is the ratio. Rates are samples per second of the iterating
thread's CPU time (`time.thread_time`: everything runs in this thread), which other processes on a shared
machine disturb far less than wall time; wall-time ratios are printed beside them. The target is a ratio of
at least 0.99 on the realistic pipeline.

    .venv/bin/python -m bench.bench_stage_time                     # 4 shards x 250 samples, 11 rounds
    .venv/bin/python -m bench.bench_stage_time --samples 50 --rounds 1    # quick
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardcache import Dataset
from shardcache.pipeline.stage_times import STAGE_TIMES_ENV


def make_shards(root: Path, shards: int, samples: int, size: tuple[int, int]) -> list[str]:
    """`shards` tars of `samples` samples, each a JPEG of `size` (random noise) and a class label."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        path = root / f"shard_{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
                for field, data in (("jpg", jpeg.getvalue()), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{s:04d}_{i:06d}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(sample["jpg"]))
    return {"image": np.asarray(image.convert("RGB")), "label": int(sample["cls"])}


def touch(sample: dict[str, Any]) -> dict[str, Any]:
    sample["n"] = len(sample["jpg"])
    return sample


def rates(paths: list[str], fn: Callable[[dict[str, Any]], Any], timed: bool) -> tuple[float, float]:
    """(samples per CPU second, samples per wall second) of one pass, with the accounting on or off."""
    os.environ[STAGE_TIMES_ENV] = "1" if timed else "0"
    ds = Dataset.from_source("tars", paths, daemon=None).map(fn).shuffle(1024).batch(64)
    cpu, wall = time.thread_time(), time.perf_counter()
    samples = sum(len(batch) for batch in ds)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    return samples / cpu, samples / wall


def compare(
    name: str, paths: list[str], fn: Callable[[dict[str, Any]], Any], rounds: int, cost_ns: float
) -> float:
    ratios, wall_ratios, ons, offs = [], [], [], []
    rates(paths, fn, False)  # warm the page cache and the imports
    for index in range(rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        measured = {timed: rates(paths, fn, timed) for timed in order}
        ons.append(measured[True][0])
        offs.append(measured[False][0])
        ratios.append(measured[True][0] / measured[False][0])
        wall_ratios.append(measured[True][1] / measured[False][1])
    ratio = statistics.median(ratios)
    print(
        f"{name:<10} on {statistics.median(ons):>9,.0f} samples/CPU-s  off {statistics.median(offs):>9,.0f} "
        f"samples/CPU-s  on/off {ratio:.3f} (median of {rounds}, quartiles "
        f"{_quartiles(ratios)}; wall time: {statistics.median(wall_ratios):.3f}, quartiles "
        f"{_quartiles(wall_ratios)})"
    )
    # Read, map and shuffle hand over every sample, batch one item per 64: the accounting's CPU per sample.
    added = cost_ns * (3 + 1 / 64) / 1e9
    estimate = 1 / (1 + added * statistics.median(offs))
    print(f"{'':<10} estimated from the per-item cost: on/off {estimate:.4f}")
    return ratio


def node_cost_ns(items: int = 200_000, repeats: int = 7) -> float:
    """CPU ns one `TimedNode` adds per item: the best of `repeats` against the same chain untimed (the best,
    not the median: the noise of a shared machine only ever adds)."""
    from shardcache.node import Node
    from shardcache.pipeline.stage_times import StageClock

    class Items(Node):
        def gen(self) -> Any:
            return iter(range(items))

    def per_item(timed: bool) -> float:
        best = float("inf")
        for _ in range(repeats):
            node: Node = Items()
            if timed:
                node = StageClock().timed(node, "read")
            started = time.thread_time_ns()
            for _ in node:
                pass
            best = min(best, (time.thread_time_ns() - started) / items)
        return best

    return per_item(True) - per_item(False)


def _quartiles(values: list[float]) -> str:
    if len(values) < 4:
        return "-"
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.3f}-{high:.3f}"


def show_split(paths: list[str], fn: Callable[[dict[str, Any]], Any]) -> None:
    """One timed pass's `Dataset.stats()`: where the time goes in the pipeline measured."""
    os.environ[STAGE_TIMES_ENV] = "1"
    ds = Dataset.from_source("tars", paths, daemon=None).map(fn).shuffle(1024).batch(64)
    sum(len(batch) for batch in ds)
    print(f"           {ds.stats()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--samples", type=int, default=250, help="samples per shard")
    parser.add_argument("--size", default="256x192", help="JPEG width x height")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    root = Path(tempfile.mkdtemp(prefix="bench-stage-time-"))
    saved = os.environ.get(STAGE_TIMES_ENV)
    try:
        paths = make_shards(root, args.shards, args.samples, (width, height))
        print(f"{args.shards} shards x {args.samples} samples, JPEG {width}x{height}")
        cost = node_cost_ns()
        print(f"a timed hand-over costs {cost:.0f} CPU ns per item (best of 7, 200,000 items)")
        realistic = compare("realistic", paths, decode, args.rounds, cost)
        show_split(paths, decode)
        trivial = compare("trivial", paths, touch, args.rounds, cost)
        show_split(paths, touch)
        print(f"realistic on/off {realistic:.3f} (target >= 0.99); trivial on/off {trivial:.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if saved is None:
            os.environ.pop(STAGE_TIMES_ENV, None)
        else:
            os.environ[STAGE_TIMES_ENV] = saved


if __name__ == "__main__":
    main()
