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

    .venv/bin/python -m bench.bench_scale_evict                       # 10^3, 10^4, 10^5 shards
    timeout 3000 .venv/bin/python -m bench.bench_scale_evict --sizes 1000 1000000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardcached.planner import Planner


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
    args = parser.parse_args(argv)
    progress = 0.0 if args.epoch_start else args.progress
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
