"""Before and after a change: the same measurements on two checkouts, interleaved, in one session.

For refactors that must not make anything slower (docs/benchmarks.md, "Client layers"). Each round runs,
in each tree with PYTHONPATH pointing at it: `import shardcache` and `import shardcached.serving.app` in fresh
interpreters (CPU from getrusage of the children), the pipeline benchmark (ratios against tarfile and
WebDataset measured in the same run) and the open latency benchmark. Interleaving (before, after, before,
after, ...) spreads the machine's load over both.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m bench.bench_trees /tmp/before . --rounds 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PIPELINE = ["-m", "bench.bench_pipeline", "--shards", "8", "--samples", "500", "--repeats", "2", "--daemon"]
OPEN = ["-m", "bench.bench_open_latency", "--procs", "16", "--seconds", "2"]
KEEP = ("samples/s", "ratio", "opens/s", "open (until")


def env_of(tree: Path) -> dict[str, str]:
    paths = [tree / "client", tree / "daemon", tree / "protocol", tree]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


def import_cpu(tree: Path, module: str, runs: int) -> str:
    cpu, wall = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], env=env_of(tree), check=True)
        wall.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return (
        f"import {module}, {runs} fresh interpreters: CPU median {statistics.median(cpu) * 1000:.0f} ms "
        f"(min {min(cpu) * 1000:.0f}), wall median {statistics.median(wall) * 1000:.0f} ms"
    )


def bench(tree: Path, args: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, *args], cwd=tree, env=env_of(tree), capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if any(word in line for word in KEEP)]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--imports", type=int, default=10, help="fresh interpreters per import figure")
    args = parser.parse_args()
    for round_index in range(1, args.rounds + 1):
        for name, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
            print(f"=== round {round_index}: {name} ({tree})", flush=True)
            print(import_cpu(tree, "shardcache", args.imports))
            # The app module moved into the serving package; older trees have it at the top.
            app = (
                "shardcached.serving.app"
                if (tree / "daemon/shardcached/serving").is_dir()
                else "shardcached.app"
            )
            print(import_cpu(tree, app, max(1, args.imports // 2)))
            for line in (*bench(tree, PIPELINE), *bench(tree, OPEN)):
                print(line)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
