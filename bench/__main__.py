"""Run every benchmark, one after another, each in its own process: `make bench` / `python -m bench`.

Each benchmark measures its baseline in the same run and prints ratios (the machines are shared and noisy).
`--quick` uses small sizes for a smoke run; the figures in docs/benchmarks.md come from the full sizes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

# (module, full-size arguments, quick arguments)
BENCHMARKS: list[tuple[str, list[str], list[str]]] = [
    ("bench.bench_pipeline", ["--daemon"], ["--shards", "4", "--samples", "200", "--repeats", "1"]),
    ("bench.bench_hit_path", [], ["--sizes", "64", "--count", "1", "--repeats", "2"]),
    ("bench.bench_open_latency", [], ["--procs", "4", "--seconds", "1"]),
    ("bench.bench_daemon_rss", [], ["--size-mib", "64"]),
    ("bench.bench_egress", [], ["--shards", "16", "--seeds", "1"]),
    ("bench.bench_stall", [], ["--shards", "4"]),
    ("bench.bench_cache", [], ["--shards", "2", "--samples", "100", "--repeats", "1"]),
    ("bench.bench_lance_filter_index", [], ["--rows", "200000", "--ref-rows", "50000", "--repeats", "1"]),
    ("bench.bench_cluster", [], ["--quick"]),
    ("bench.bench_cluster_daemons", [], ["--quick"]),
    ("bench.bench_launchers", [], ["--quick"]),
    ("bench.bench_disk_full", [], ["--repeats", "1"]),
    ("bench.bench_loader", [], ["--quick"]),
    ("bench.bench_threads", [], ["--quick", "--repeats", "1"]),
    ("bench.bench_scale_evict", [], ["--sizes", "1000", "10000", "--decisions", "20"]),
    ("bench.bench_decode", ["--rounds", "9"], ["--images", "4", "--rounds", "1"]),
    ("bench.bench_scale_client", [], ["--sizes", "1000", "10000", "--repeats", "1", "--no-uss"]),
    ("bench.bench_hangs", ["--runs", "50"], ["--runs", "2", "--methods", "fork"]),
    ("bench.bench_scale_daemon", [], ["--sizes", "1000", "10000"]),
    ("bench.bench_deal", [], ["--sizes", "1000", "10000", "--repeats", "1"]),
    ("bench.bench_recovery", ["--plans", "64"], ["--sizes", "10000"]),
    ("bench.bench_validation", [], ["--sizes", "1000", "--head-sample", "500"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to quote")
    parser.add_argument("only", nargs="*", help="run only benchmarks whose module name contains one of these")
    args = parser.parse_args(argv)
    failed = []
    for module, full, quick in BENCHMARKS:
        if args.only and not any(word in module for word in args.only):
            continue
        command = [sys.executable, "-m", module, *(quick if args.quick else full)]
        print(f"\n=== {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        status = subprocess.call(command)
        print(f"=== {module}: exit {status} in {time.monotonic() - started:.0f}s", flush=True)
        if status != 0:
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
