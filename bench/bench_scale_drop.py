"""A plan dropped while it holds many resident shards: how long the planner's one step takes (issue 25).

In-process, the planner alone (no daemon, no files). One job's slot has its plans for epochs 0 and 1 over a
dataset of `--urls` shards (two shuffles); R of the shards are resident (told to the planner as the store
would). Then the plan of epoch 0 is dropped, as `DELETE /v1/plans/{id}` or a stale (job, slot)'s expiry
does: `Planner.drop_plan` runs on the daemon's event loop in one step, and it refiles every resident url the
plan held (`NextUseIndex.dropped`), so the step grows with R. Printed per R: that step's thread CPU time and
wall time, and the ratio to the smallest R. Its index entries are then removed in bounded steps
(`unindex_more`, not timed here: bench_scale_daemon's loop trace covers those).

    .venv/bin/python -m bench.bench_scale_drop --urls 1000000 --resident 1000 10000 100000
"""

from __future__ import annotations

import argparse
import random
import time

from shardcached.planner import Planner


def measure(urls: int, resident: int, seed: int) -> tuple[float, float]:
    """(thread CPU s, wall s) of dropping the epoch-0 plan holding `resident` resident shards."""
    rng = random.Random(seed)
    names = [f"s3://bucket/shard-{i:07d}.tar" for i in range(urls)]
    planner = Planner(prefetch_depth=0, clock=lambda: 1000.0, stale_after_s=1e9)
    current = planner.add_plan("job", 0, 0, rng.sample(names, len(names)))
    planner.add_plan("job", 0, 1, rng.sample(names, len(names)))
    for url in rng.sample(names, resident):
        planner.resident(url)
    cpu, wall = time.thread_time(), time.perf_counter()
    assert planner.drop_plan(current)
    return time.thread_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_drop", description=__doc__)
    parser.add_argument("--urls", type=int, default=100_000, help="shards in each plan")
    parser.add_argument("--resident", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{'urls':>9} {'resident':>9} {'drop cpu ms':>12} {'drop wall ms':>13}")
    rows = []
    for resident in args.resident:
        cpu, wall = measure(args.urls, min(resident, args.urls), args.seed)
        rows.append((resident, cpu))
        print(f"{args.urls:>9} {resident:>9} {cpu * 1e3:>12.1f} {wall * 1e3:>13.1f}", flush=True)
    (low, low_cpu), (high, high_cpu) = rows[0], rows[-1]
    if high > low:
        print(f"ratio {high}/{low} resident: drop cpu {high_cpu / low_cpu:.1f}x")


if __name__ == "__main__":
    main()
