"""The persistent Lance indexes against scanning each time (what every reader did before them).

On one local Lance dataset of `--rows` rows (an int64 `value`, a 32-byte string `key`, fragments of
`--fragment-rows` rows) and one filter (an OR of predicates, ANDed with a second group), in this process:

- filter, scan: the row positions computed by scanning each predicate (the baseline: no index);
- filter, build: the first reader's cost, scan + writing the index parts (atomic publication);
- filter, reuse: a later reader's cost, reading the index (sizes and CRC-32s checked);
- filter, first sample: time to the first sample of `from_source(...).filter(...)` with an empty cache
  against a warm one (what a trainer's start sees; includes opening the dataset);
- refs: opening a reference table of `--ref-rows` string keys and looking up 10,000 random keys, then
  every key: by scanning its key column into one dict (the baseline, what each process did) against
  reading the `lance-ref-index-v1` entry (whose buckets become dicts on first use).

Medians of `--repeats` runs; ratios are baseline / indexed (higher is better) and build / scan (the
first reader's overhead).

    .venv/bin/python -m bench.bench_lance_filter_index                         # 2M rows, 500k ref keys
    .venv/bin/python -m bench.bench_lance_filter_index --rows 200000 --ref-rows 50000 --repeats 2  # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from shardcache import Dataset
from shardcache.sources.lance import index as lance_index

GROUPS = (("value % 7 = 0", "value % 11 = 0", "value < 1000"), ("value >= 100",))


def median_s(run: Callable[[], Any], repeats: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_source(root: Path, rows: int, fragment_rows: int) -> str:
    uri = str(root / "source.lance")
    values = np.arange(rows, dtype=np.int64)
    keys = pa.array([f"{i:032d}" for i in range(rows)])
    lance.write_dataset(pa.table({"value": values, "key": keys}), uri, max_rows_per_file=fragment_rows)
    return uri


def write_refs(root: Path, rows: int) -> str:
    uri = str(root / "refs.lance")
    table = pa.table({"key": [f"img-{i:010d}" for i in range(rows)], "payload": [b"x" * 16] * rows})
    lance.write_dataset(table, uri, max_rows_per_file=65536)
    return uri


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--fragment-rows", type=int, default=65536)
    parser.add_argument("--ref-rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-lance-index-"))
    cache = work / "cache"
    os.environ["SHARDCACHE_CACHE_DIR"] = str(cache)

    def clear() -> None:
        shutil.rmtree(cache, ignore_errors=True)

    try:
        uri = write_source(work, args.rows, args.fragment_rows)
        ds = lance.dataset(uri)
        n = ds.count_rows()
        _, bases, _ = lance_index._plan_parts(ds)
        scan = median_s(lambda: lance_index._part_rows(ds, uri, GROUPS, None, bases), args.repeats)
        build = median_s(lambda: lance_index.filter_positions(ds, uri, GROUPS, n), args.repeats, clear)
        reuse = median_s(lambda: lance_index.filter_positions(ds, uri, GROUPS, n), args.repeats)
        matched = len(lance_index.filter_positions(ds, uri, GROUPS, n))

        def first_sample() -> None:
            next(iter(Dataset.from_source("lance", uri).filter(list(GROUPS[0])).filter(GROUPS[1][0])))

        cold = median_s(first_sample, args.repeats, clear)
        warm = median_s(first_sample, args.repeats)

        refs_uri = write_refs(work, args.ref_rows)
        refs = [lance.dataset(refs_uri)]
        rng = np.random.default_rng(0)
        some = [f"img-{i:010d}" for i in rng.integers(0, args.ref_rows, 10_000)]
        every = [f"img-{i:010d}" for i in range(args.ref_rows)]

        def scanned(wanted: list[str]) -> None:  # what RefTable did: scan the key column into one dict
            keys, owners, rows, _ = lance_index._scan_keys(refs, "key")
            table = dict(zip(keys, zip(owners, rows, strict=True), strict=True))
            for key in wanted:
                table[key]

        def indexed(wanted: list[str]) -> None:
            table = lance_index.ref_rows(refs, [refs_uri], "key")
            for key in wanted:
                table[key]

        lance_index.ref_rows(refs, [refs_uri], "key")  # built once
        ref_some = (
            median_s(lambda: scanned(some), args.repeats),
            median_s(lambda: indexed(some), args.repeats),
        )
        ref_all = (
            median_s(lambda: scanned(every), args.repeats),
            median_s(lambda: indexed(every), args.repeats),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    fragments = -(-args.rows // args.fragment_rows)
    print(f"dataset: {args.rows} rows in {fragments} fragments; filter {GROUPS} keeps {matched} rows")
    print(f"filter, scan (baseline)    {scan * 1000:9.1f} ms")
    print(f"filter, build (first)      {build * 1000:9.1f} ms   build / scan = {build / scan:.2f}")
    print(f"filter, reuse              {reuse * 1000:9.1f} ms   scan / reuse = {scan / reuse:.1f}x")
    print(f"first sample, empty cache  {cold * 1000:9.1f} ms")
    print(f"first sample, warm cache   {warm * 1000:9.1f} ms   cold / warm = {cold / warm:.1f}x")
    for label, (scan_s, index_s) in (("10k random keys", ref_some), ("every key", ref_all)):
        print(
            f"refs ({args.ref_rows} keys), {label}: scan {scan_s * 1000:.1f} ms, "
            f"index {index_s * 1000:.1f} ms   scan / index = {scan_s / index_s:.1f}x"
        )


if __name__ == "__main__":
    main()
