"""A plan dropped while it holds many resident shards: the loop's longest step after it (issue 25).

In-process, the planner alone (no daemon, no files). One job's slot has its plans for epochs 0 and 1 over a
dataset of `--urls` shards (two shuffles); R of the shards are resident (told to the planner as the store
would). Then the plan of epoch 0 is dropped, as `DELETE /v1/plans/{id}` or a stale (job, slot)'s expiry
does (`Planner.drop_plan`, one loop step), and the daemon's indexer (`PlanIndexer.step`, default budget)
works off what follows in its own loop steps: refiling the resident shards the plan held (where the tree has
lazy refiling) and removing its index entries. Printed per R, in thread CPU time: the drop's step, the
longest indexer step, its 99th percentile, how many steps took over 10 ms, the indexer's step count and
total, and the worst case of lazy refiling: the epoch-1 plan dropped and an eviction decision
(`choose_resident_victim`) wanted at once, before any indexer step. A tree with `indexing.refiled` (what
`Space.make_room` awaits first) refiles in pieces, the loop free between them: its longest step and total
are the last two columns, and the decision then finds nothing pending; on a tree without it the decision
settles every pending refile itself, in one step (the drop's step plus the decision's).

With `--baseline TREE` each R is measured on TREE too (its daemon/ first on the path, this script), in the
same run, alternating:

    PYTHONPATH=daemon:client:protocol .venv/bin/python -m bench.bench_scale_drop --baseline /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine

try:
    from shardcached.planning import Planner, indexing
except ImportError:  # a tree before the planning package (--baseline)
    from shardcached.planner import Planner  # type: ignore[no-redef]

    from shardcached import indexing  # type: ignore[attr-defined,no-redef]

PlanIndexer = indexing.PlanIndexer

Row = dict[str, float]
# Trees before `indexing.refiled` settle inside the decision, in one step (the last column alone then).
Refiled = Callable[[Planner], Coroutine[None, None, None]]
REFILED: Refiled | None = getattr(indexing, "refiled", None)


def cpu_of(work: Callable[[], object]) -> float:
    """Thread CPU seconds of calling `work`."""
    start = time.thread_time()
    work()
    return time.thread_time() - start


def measure(urls: int, resident: int, seed: int) -> Row:
    """The CPU of a drop holding `resident` resident shards and what follows (see the module docstring)."""
    rng = random.Random(seed)
    names = [f"s3://bucket/shard-{i:07d}.tar" for i in range(urls)]
    planner = Planner(prefetch_depth=0, clock=lambda: 1000.0, stale_after_s=1e9)
    current = planner.add_plan("job", 0, 0, rng.sample(names, len(names)))
    following = planner.add_plan("job", 0, 1, rng.sample(names, len(names)))
    for url in rng.sample(names, resident):
        planner.resident(url)
    indexer = PlanIndexer(planner)
    drop = cpu_of(lambda: planner.drop_plan(current))
    steps: list[float] = []
    busy = [True]
    while busy[0]:
        steps.append(cpu_of(lambda: busy.__setitem__(0, indexer.step())))
    worst_drop = cpu_of(lambda: planner.drop_plan(following))
    awaited = awaited_refile(planner) if REFILED is not None else []
    decide = cpu_of(lambda: planner.choose_resident_victim(lambda url: True))
    return {
        "drop": drop,
        "longest": max(steps),
        "p99": sorted(steps)[int(0.99 * (len(steps) - 1))],
        "over": sum(step > 0.010 for step in steps),
        "total": sum(steps),
        "steps": len(steps),
        "worst_drop": worst_drop,
        "decide": decide,
        "awaited_longest": max(awaited, default=0.0),
        "awaited_total": sum(awaited),
    }


def awaited_refile(planner: Planner) -> list[float]:
    """The thread CPU of each loop step of `indexing.refiled` (what an open that needs room awaits before
    its decision), driven by hand: one `send` is one step between two yields to the loop."""
    steps: list[float] = []
    assert REFILED is not None
    waiting = REFILED(planner)
    while True:
        start = time.thread_time()
        try:
            waiting.send(None)
        except StopIteration:
            steps.append(time.thread_time() - start)
            return steps
        steps.append(time.thread_time() - start)


def run_on(tree: str, urls: int, resident: int, seed: int) -> Row:
    """`measure` in a subprocess whose daemon package is `tree`'s."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([f"{tree}/daemon", f"{tree}/protocol", os.getcwd()])
    argv = ["--urls", str(urls), "--resident", str(resident), "--seed", str(seed), "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_scale_drop", *argv],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    row: Row = json.loads(out.stdout)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scale_drop", description=__doc__)
    parser.add_argument("--urls", type=int, default=100_000, help="shards in each plan")
    parser.add_argument("--resident", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", metavar="TREE", help="a checkout to measure too (e.g. main)")
    parser.add_argument("--json", action="store_true", help="one R, measured here, printed as JSON")
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(measure(args.urls, min(args.resident[0], args.urls), args.seed)))
        return
    trees = [("this", os.getcwd())] + ([("base", args.baseline)] if args.baseline else [])
    print(
        f"{'tree':<5} {'urls':>8} {'resident':>8} {'drop ms':>8} {'longest step ms':>15} {'p99 ms':>6}"
        f" {'>10ms':>5} {'steps':>6} {'total ms':>9} {'drop+decision ms':>16} {'awaited: step ms':>16}"
        f" {'total ms':>8}"
    )
    for resident in args.resident:
        for name, tree in trees:
            row = run_on(tree, args.urls, min(resident, args.urls), args.seed)
            print(
                f"{name:<5} {args.urls:>8} {resident:>8} {row['drop'] * 1e3:>8.1f}"
                f" {row['longest'] * 1e3:>15.1f} {row['p99'] * 1e3:>6.1f} {row['over']:>5.0f}"
                f" {row['steps']:>6.0f} {row['total'] * 1e3:>9.1f}"
                f" {(row['worst_drop'] + row['decide']) * 1e3:>16.1f} {row['awaited_longest'] * 1e3:>16.1f}"
                f" {row['awaited_total'] * 1e3:>8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
