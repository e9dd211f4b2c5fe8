"""`.cache()`: a second pass through a cached CPU-heavy map against recomputing it, and the cached read rate
against reading the source shards.

Both sides of each ratio run in this process, interleaved and repeated (medians), on the same tar shards:

- recompute / cached: one pass of `tars -> map(heavy_decode)` against one pass of the same pipeline after
  `.cache()` (the entry already built). Higher is better.
- cached read rate / source read rate: samples/s of `tars -> cache()` (reading the Lance entry) against
  samples/s of `tars` itself. Around 1 or above means reading the cache costs no more than the source.
- build: the first pass of the cached pipeline (compute + write + merge) with 1 and 2 `cache_num_workers`,
  against one uncached pass.

    .venv/bin/python -m bench.bench_cache                             # 8 shards x 500 samples of 4 KiB
    .venv/bin/python -m bench.bench_cache --shards 4 --samples 200    # quick
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import statistics
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from shardcache import Dataset, RuntimeContext

CTX = RuntimeContext()


def heavy_decode(sample: dict[str, Any]) -> dict[str, Any]:
    """A CPU-heavy map standing in for image decode or tokenisation (about 1 ms per sample here)."""
    digest = sample["bin"]
    for _ in range(1500):
        digest = hashlib.sha256(digest).digest()
    return {**sample, "feature": digest, "label": digest[0]}


def write_shards(directory: Path, shards: int, samples: int, payload: int) -> str:
    for index in range(shards):
        with tarfile.open(directory / f"shard_{index:06d}.tar", "w") as tar:
            for i in range(samples):
                body = bytes((index * 31 + i + j) % 256 for j in range(payload))
                info = tarfile.TarInfo(f"s{index:04d}_{i:05d}.bin")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return str(directory / f"shard_{{000000..{shards - 1:06d}}}.tar")


def one_pass(dataset: Dataset) -> tuple[float, int]:
    started = time.perf_counter()
    count = sum(1 for _ in dataset.iter_context(CTX))
    return time.perf_counter() - started, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=500, help="samples per shard")
    parser.add_argument("--payload", type=int, default=4096, help="bytes per sample")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        pattern = write_shards(root, args.shards, args.samples, args.payload)
        source = Dataset.from_source("tars", pattern, daemon=None)
        heavy = source.map(heavy_decode)
        total = args.shards * args.samples
        print(f"{args.shards} shards x {args.samples} samples of {args.payload} B = {total} samples")

        builds = {}
        for workers in (1, 2):
            cached = heavy.cache(cache_dir=str(root / f"cache-w{workers}"), cache_num_workers=workers)
            builds[workers], count = one_pass(cached)
            assert count == total, (count, total)
        plain_source = source.cache(cache_dir=str(root / "cache-plain"))
        one_pass(plain_source)  # build the entry of the bare source

        recompute, reread, source_reads, cache_reads = [], [], [], []
        cached = heavy.cache(cache_dir=str(root / "cache-w1"))
        for _ in range(args.repeats):
            recompute.append(one_pass(heavy)[0])
            reread.append(one_pass(cached)[0])
            source_reads.append(one_pass(source)[0])
            cache_reads.append(one_pass(plain_source)[0])
        med = statistics.median
        line = "{:<29}: {:7.3f} s  ({:9.0f} samples/s)"
        print(line.format("uncached pass with heavy map", med(recompute), total / med(recompute)))
        print(line.format("cached pass (second on)", med(reread), total / med(reread)))
        for workers, seconds in builds.items():
            label = f"first cached pass, {workers} worker(s)"
            print(f"{label:<29}: {seconds:7.3f} s  ({seconds / med(recompute):.2f}x an uncached pass)")
        print(f"{'read source tars':<29}: {total / med(source_reads):9.0f} samples/s")
        print(f"{'read cached entry':<29}: {total / med(cache_reads):9.0f} samples/s")
        print(f"RATIO recompute / cached second pass : {med(recompute) / med(reread):.1f}x")
        print(f"RATIO cached read rate / source rate : {med(source_reads) / med(cache_reads):.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
