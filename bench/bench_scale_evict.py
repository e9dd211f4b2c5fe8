"""Eviction decision time at 10^3..10^6 resident shards and 1, 16, 64 plans: ordered index against the scan.

The planner alone (no daemon, no files: only the bookkeeping costs). Scenario per (R, P): a dataset of R
shards, every one resident (as if the cache held them all and one more must come in); S = max(1, P / 2)
slots of one job, each with its plans for the current and the next epoch (P plans; one plan when P = 1), each
epoch a fresh shuffle dealt across the slots, so every shard lies in one plan per epoch. Opens then move
every slot part-way through the current epoch (`--progress`, 30%: the shards read so far are needed only next
epoch), with slots at different paces.

Measured in the same run, on the same planner state:

* new: `Planner.choose_resident_victim` (nextuse.py), a demand eviction, median over `--decisions` decisions,
  one open of a rotating slot between two (the state moves on as in a real run);
* old: `Planner.choose_victim` over the list of evictable shards in the store's order, which is what
  `Space.make_room` did (the list built per decision is included), median of `--old-repeats`;
* open: `Planner.record_open` (cursor move, recency, and the index's update), median, against the same opens
  on a planner that has the same plans but no resident shards (what an open cost before the index).

Both must choose the same victim (checked). `--epoch-start` puts every cursor at 0 instead: every resident
shard is still ahead in the current epoch and planned again in the next (the case that made the first
version's threshold walk, over every chain's full order, meet every next-epoch entry).

`--memory` measures instead, per (R, P), each in a fresh subprocess (this tree's daemon package, and with
`--baseline TREE` that tree's, alternating): the peak RSS of the process that built the scenario (its own
url strings and lists included: they are the strings a daemon's table would hold), the planner's share of
the traced allocations (tracemalloc, by file, with `--breakdown`), the objects the garbage collector
tracks, and the longest of five full collections once the benchmark's own lists are gone (what the
planner's state costs a collection).

    .venv/bin/python -m bench.bench_scale_evict                       # 10^3, 10^4, 10^5 shards
    timeout 3000 .venv/bin/python -m bench.bench_scale_evict --sizes 1000 1000000
    .venv/bin/python -m bench.bench_scale_evict --memory --sizes 1000 1000000 --plans 64 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

try:
    from shardcached.planning import Planner
except ImportError:  # a tree before the planning package (--baseline)
    from shardcached.planner import Planner  # type: ignore[no-redef]


@dataclass
class Row:
    resident: int
    plans: int
    new_ms: float
    old_ms: float
    open_us: float
    open_base_us: float


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def build(
    resident: int, plans: int, progress: float, seed: int, with_residents: bool
) -> tuple[Planner, list[str], Callable[[int], None]]:
    """A planner in the scenario's state, the store's order, and `step(i)`: one open of slot i % S."""
    rng = random.Random(seed)
    clock = Clock()
    planner = Planner(stale_after_s=1e9, clock=clock)
    urls = [f"s3://bucket/shard-{i:07d}.tar" for i in range(resident)]
    slots = max(1, plans // 2)
    epochs = 1 if plans == 1 else 2
    orders: list[list[list[str]]] = []
    for _ in range(epochs):
        perm = rng.sample(urls, len(urls))
        orders.append([perm[s::slots] for s in range(slots)])
    ids = [[planner.add_plan("job", s, e, orders[e][s]) for e in range(epochs)] for s in range(slots)]
    store_order = rng.sample(urls, len(urls)) if with_residents else []
    for url in store_order:  # fetched in some order: recency and the store's order
        planner.resident(url)
        planner.touch(url)
    paces = [1.0 + 0.1 * s for s in range(slots)]  # slots at different speeds: their time lines differ
    done = [0] * slots

    def step(i: int) -> None:
        s = i % slots
        clock.now += 0.01
        plan = orders[0][s]
        if done[s] < len(plan):
            planner.record_open(plan[done[s]], ids[s][0])
            done[s] += 1
        clock.now += paces[s] * 0.001

    for i in range(int(progress * resident)):
        step(i)
    return planner, store_order, step


def measure(resident: int, plans: int, progress: float, decisions: int, old_repeats: int, seed: int) -> Row:
    planner, store_order, step = build(resident, plans, progress, seed, with_residents=True)

    def usable(url: str) -> bool:
        return True

    new_times, open_times = [], []
    for i in range(decisions):
        started = time.perf_counter()
        step(i)
        opened = time.perf_counter()
        planner.choose_resident_victim(usable)
        open_times.append(opened - started)
        new_times.append(time.perf_counter() - opened)
    old_times = []
    for _ in range(old_repeats):
        started = time.perf_counter()
        pool = [url for url in store_order if usable(url)]
        old = planner.choose_victim(pool)
        old_times.append(time.perf_counter() - started)
        new = planner.choose_resident_victim(usable)
        assert old == new, f"the index chose {new}, the scan {old}"
    del planner, step  # one planner in memory at a time (10^6 shards)
    base, _, base_step = build(resident, plans, progress, seed, with_residents=False)
    base_times = []
    for i in range(decisions):
        started = time.perf_counter()
        base_step(i)
        base_times.append(time.perf_counter() - started)
    return Row(
        resident,
        plans,
        statistics.median(new_times) * 1e3,
        statistics.median(old_times) * 1e3,
        statistics.median(open_times) * 1e6,
        statistics.median(base_times) * 1e6,
    )


def memory(resident: int, plans: int, progress: float, seed: int, breakdown: bool) -> dict[str, object]:
    """The scenario's state built here: peak RSS, traced bytes by file, tracked objects, full collections."""
    if breakdown:
        tracemalloc.start()
    planner, store_order, step = build(resident, plans, progress, seed, with_residents=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    by_file: dict[str, float] = {}
    if breakdown:
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        for stat in snapshot.statistics("filename")[:12]:
            name = stat.traceback[0].filename
            by_file[name.split("site-packages/")[-1].split("/daemon/")[-1]] = stat.size / 1e6
        del snapshot
    del store_order, step  # the benchmark's own lists of urls: a daemon holds none of them
    gc.collect()
    collections = []
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        collections.append(time.perf_counter() - started)
    assert planner.plan_count == plans
    return {
        "peak_mb": peak_mb,
        "tracked": len(gc.get_objects()),
        "gc_ms": max(collections) * 1e3,
        "gc_median_ms": statistics.median(collections) * 1e3,
        "by_file": by_file,
    }


def memory_on(
    tree: str, resident: int, plans: int, progress: float, seed: int, breakdown: bool
) -> dict[str, object]:
    """`memory` in a subprocess whose daemon package is `tree`'s."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([f"{tree}/daemon", f"{tree}/protocol", os.getcwd()])
    argv = ["--sizes", str(resident), "--plans", str(plans), "--progress", str(progress), "--seed", str(seed)]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_scale_evict",
            "--memory-json",
            *argv,
            *(["--breakdown"] if breakdown else []),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    row: dict[str, object] = json.loads(out.stdout)
    return row


def main_memory(args: argparse.Namespace, progress: float) -> None:
    trees = [("this", os.getcwd())] + ([("base", args.baseline)] if args.baseline else [])
    header = ("tree", "resident", "plans", "peak RSS MB", "tracked", "full gc ms", "median")
    print("{:<5} {:>9} {:>5} {:>11} {:>9} {:>10} {:>7}".format(*header))
    for resident in args.sizes:
        for plans in args.plans:
            for name, tree in trees:
                row = memory_on(tree, resident, plans, progress, args.seed, args.breakdown)
                print(
                    f"{name:<5} {resident:>9} {plans:>5} {row['peak_mb']:>11.1f} {row['tracked']:>9}"
                    f" {row['gc_ms']:>10.2f} {row['gc_median_ms']:>7.2f}",
                    flush=True,
                )
                by_file = row["by_file"]
                assert isinstance(by_file, dict)
                for file, megabytes in by_file.items():
                    print(f"      {megabytes:>9.1f} MB traced in {file}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_evict", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--plans", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--progress", type=float, default=0.3, help="share of the epoch each slot has read")
    parser.add_argument(
        "--epoch-start", action="store_true", help="every cursor at 0 (the walk's worst case)"
    )
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--old-repeats", type=int, default=3, help="scans timed (one above 10^5 shards)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", action="store_true", help="peak RSS and collections instead (see above)")
    parser.add_argument("--breakdown", action="store_true", help="with --memory: traced bytes by file")
    parser.add_argument("--baseline", metavar="TREE", help="with --memory: a checkout to measure too")
    parser.add_argument("--memory-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    progress = 0.0 if args.epoch_start else args.progress
    if args.memory_json:
        print(json.dumps(memory(args.sizes[0], args.plans[0], progress, args.seed, args.breakdown)))
        return
    if args.memory:
        main_memory(args, progress)
        return
    rows = []
    header = ("resident", "plans", "new ms", "old ms", "new/old", "open us", "open before")
    print("{:>9} {:>5} {:>9} {:>10} {:>9} {:>8} {:>11}".format(*header))
    for resident in args.sizes:
        for plans in args.plans:
            repeats = args.old_repeats if resident <= 100_000 else 1
            row = measure(resident, plans, progress, args.decisions, repeats, args.seed)
            rows.append(row)
            print(
                f"{row.resident:>9} {row.plans:>5} {row.new_ms:>9.4f} {row.old_ms:>10.2f} "
                f"{row.new_ms / row.old_ms:>9.5f} {row.open_us:>8.1f} {row.open_base_us:>11.1f}",
                flush=True,
            )
    smallest, largest = min(args.sizes), max(args.sizes)
    for plans in args.plans:
        low = next(r for r in rows if r.resident == smallest and r.plans == plans)
        high = next(r for r in rows if r.resident == largest and r.plans == plans)
        print(
            f"{plans} plans: {largest}/{smallest} resident: new {high.new_ms / low.new_ms:.2f}x "
            f"({high.new_ms:.4f} ms), old {high.old_ms / low.old_ms:.0f}x; "
            f"open {high.open_us / low.open_us:.2f}x"
        )


if __name__ == "__main__":
    main()
