"""Plan registration at scale: how long a plan of n urls takes to register and delete, and how long a hit on
another connection waits meanwhile (issue 25; target at 1M urls: no hit waits more than 50 ms).

For each n, a real daemon (prefetch off) gets one plan of n `s3://` urls (nothing is fetched: registration
only canonicalises, allow-lists and indexes them) while a probe process loops on another connection: a
`GET /v1/health` and a warm open + release of a resident local shard. The probes run from the registration
until 2 s after its answer (the background indexing), then through the deletion and 2 s after it. Printed
per n: the registration and deletion answer times, and p99 / worst of the probes; then the ratios 1M/1k.
A daemon that takes shard lists (`PUT /v1/shardlists/{digest}`) then gets the same n urls as a shard list
(the upload's answer time), and two plans over it, each answered once the list is cached: epoch 0 reading
it in order and epoch 1 a shuffle of it (the probes go on meanwhile).
With `--baseline DIR` (a checkout of main: `git worktree add --detach /tmp/scale-base main`) the same runs
against that tree's daemon, in the same run, and the ratios this/baseline are printed.

The probes' waits include whatever else the machine runs. What the daemon itself controls is measured too
(unless `--no-trace`): the daemon runs under `bench/looptrace.py`, which times every event-loop step in CPU
time of the loop's thread (independent of other processes) and wall time; printed per n and per phase
(registration: from the request to the deletion; deletion: from its request to the end), the p99 and the
worst step's CPU time, the worst step's wall time, the steps over 20 ms of CPU, the longest
garbage-collector pass, and the code of the worst steps. Traced, the daemon runs asyncio's loop instead of
uvloop (uvloop's callbacks run in C, out of reach); the daemon's own steps are the same code.

    .venv/bin/python -m bench.bench_scale_daemon --sizes 1000 10000 100000 1000000 --baseline /tmp/scale-base
    .venv/bin/python -m bench.bench_scale_daemon --sizes 1000 10000                    # quick
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import looptrace
from harness.devservers import start_daemon

BUCKET = "s3://bench-scale"
SLOW_CPU_S = 0.020  # a loop step over this much CPU is counted (the 50 ms target leaves room for the noise)


def probe(socket: str, shard: str, stop: Any, out: Any) -> None:
    """Loop health and warm open/release until `stop`; send the latencies (seconds) back."""
    transport = httpx.HTTPTransport(uds=socket)
    health, opens = [], []
    with httpx.Client(transport=transport, base_url="http://d", timeout=600) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/v1/health").raise_for_status()
            health.append(time.perf_counter() - started)
            started = time.perf_counter()
            grant = http.post("/v1/shards/open", json={"url": shard})
            grant.raise_for_status()
            opens.append(time.perf_counter() - started)
            http.post("/v1/shards/release", json={"lease": grant.json()["lease"]}).raise_for_status()
            time.sleep(0.002)
    out.put((health, opens))


def loop_steps(trace: Path, phases: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Per phase: p99 and worst step CPU (ms), worst step wall (ms), steps over `SLOW_CPU_S`, the longest
    gc pass (ms) and the labels of the three steps with the most CPU (see looptrace.py)."""
    steps = np.fromfile(f"{trace}.steps", dtype=np.float64).reshape(3, -1)
    detail = json.loads(Path(f"{trace}.json").read_text())
    out: dict[str, Any] = {}
    for phase, (begin, end) in phases.items():
        inside = (steps[0] >= begin) & (steps[0] < end)
        cpu, wall = steps[1][inside], steps[2][inside]
        slow = [d for d in detail["steps"] if begin <= d["start"] < end]
        gcs = [g for g in detail["gc"] if begin <= g["start"] < end]
        worst = sorted(slow, key=lambda d: -d["cpu"])[:3]
        out[phase] = {
            "steps": int(inside.sum()),
            "cpu_p99_ms": float(np.percentile(cpu, 99)) * 1e3 if cpu.size else 0.0,
            "cpu_max_ms": float(cpu.max()) * 1e3 if cpu.size else 0.0,
            "wall_max_ms": float(wall.max()) * 1e3 if wall.size else 0.0,
            "over_20ms": int((cpu > SLOW_CPU_S).sum()),
            "gc_max_ms": max((g["wall"] for g in gcs), default=0.0) * 1e3,
            "worst": [f"{d['cpu'] * 1e3:.1f}ms cpu {d['wall'] * 1e3:.1f}ms wall: {d['what']}" for d in worst]
            + [
                f"gc pass {g['wall'] * 1e3:.1f}ms wall: generation {g['generation']} in {g['thread']}"
                for g in sorted(gcs, key=lambda g: -g["wall"])[:1]
            ],
        }
    return out


def run_one(n: int, tree: Path | None, work: Path, trace: bool = True) -> dict[str, Any]:
    shards = work / "local"
    shards.mkdir(exist_ok=True)
    shard = shards / "warm.tar"
    shard.write_bytes(os.urandom(4096))
    env = {}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / part) for part in ("daemon", "client", "protocol"))
    cache = work / f"cache-{n}-{'base' if tree else 'this'}"
    trace_path = work / f"trace-{n}-{'base' if tree else 'this'}"
    daemon = start_daemon(
        work / "d.sock",
        cache,
        [BUCKET, str(shards)],
        extra_args=["--prefetch-depth", "0"],
        env=env,
        log=work / "daemon.log",
        wrapper=looptrace.wrapper(trace_path) if trace else (),
    )
    try:
        urls = [f"{BUCKET}/train/shard-{i:07d}.tar" for i in range(n)]
        body = json.dumps({"job": "bench", "slot": 0, "epoch": 0, "urls": urls}).encode()
        transport = httpx.HTTPTransport(uds=daemon.socket)
        with httpx.Client(transport=transport, base_url="http://d", timeout=600) as http:
            grant = http.post("/v1/shards/open", json={"url": str(shard)}).json()
            http.post("/v1/shards/release", json={"lease": grant["lease"]}).raise_for_status()
            ctx = multiprocessing.get_context("spawn")
            stop, out = ctx.Event(), ctx.Queue()
            prober = ctx.Process(target=probe, args=(daemon.socket, str(shard), stop, out))
            prober.start()
            time.sleep(1.0)  # the probe process is up and looping (spawn imports take a while)
            started = register_at = time.perf_counter()
            answer = http.post("/v1/plans", content=body, headers={"content-type": "application/json"})
            register_s = time.perf_counter() - started
            answer.raise_for_status()
            plan = answer.json()["plan"]
            time.sleep(2.0)
            started = delete_at = time.perf_counter()
            http.delete(f"/v1/plans/{plan}").raise_for_status()
            delete_s = time.perf_counter() - started
            time.sleep(2.0)
            listed = register_listed(http, urls)
            if listed:
                time.sleep(2.0)
            stop.set()
            health, opens = out.get(timeout=600)
            prober.join()
            end_at = time.perf_counter()
    finally:
        daemon.stop()
        shutil.rmtree(cache, ignore_errors=True)
    phases = {"register": (register_at, delete_at), "delete": (delete_at, end_at)}
    return {
        "loop": loop_steps(trace_path, phases) if trace else {},
        **listed,
        "register_s": register_s,
        "delete_s": delete_s,
        "health_p99_ms": float(np.percentile(health, 99)) * 1e3,
        "health_max_ms": max(health) * 1e3,
        "open_p99_ms": float(np.percentile(opens, 99)) * 1e3,
        "open_max_ms": max(opens) * 1e3,
        "probes": len(health),
    }


def register_listed(http: httpx.Client, urls: list[str]) -> dict[str, float]:
    """Upload `urls` as a shard list and register two plans over it (see the module); their answer times,
    or nothing from a daemon without shard lists."""
    blob = "\n".join(urls).encode()
    digest = hashlib.sha256(blob).hexdigest()
    started = time.perf_counter()
    put = http.put(f"/v1/shardlists/{digest}", content=blob)
    put_s = time.perf_counter() - started
    if put.status_code in (404, 405):
        return {}
    put.raise_for_status()
    times = {"list_put_s": put_s}
    orders = {0: np.arange(len(urls)), 1: np.random.default_rng(0).permutation(len(urls))}
    for epoch, order in orders.items():
        positions = base64.b64encode(order.astype("<i4").tobytes()).decode()
        body = {"job": "bench", "slot": 1, "epoch": epoch, "shardlist": digest, "positions": positions}
        started = time.perf_counter()
        http.post("/v1/plans", json=body).raise_for_status()
        times[f"list_plan{epoch}_s"] = time.perf_counter() - started
    return times


def show(label: str, results: dict[int, dict[str, Any]]) -> None:
    print(f"\n{label}")
    print(
        f"{'urls':>9} {'register s':>11} {'delete s':>9} {'health p99':>11} {'health max':>11} "
        f"{'open p99':>9} {'open max':>9} {'probes':>7}"
    )
    for n, r in results.items():
        print(
            f"{n:>9} {r['register_s']:>11.3f} {r['delete_s']:>9.3f} {r['health_p99_ms']:>9.1f}ms "
            f"{r['health_max_ms']:>9.1f}ms {r['open_p99_ms']:>7.1f}ms {r['open_max_ms']:>7.1f}ms "
            f"{int(r['probes']):>7}"
        )
    if any("list_put_s" in r for r in results.values()):
        print(
            f"{'urls':>9} {'list PUT s':>11} {'plan s':>9} {'shuffled s':>11}   (plans over the cached list)"
        )
        for n, r in results.items():
            if "list_put_s" in r:
                print(f"{n:>9} {r['list_put_s']:>11.3f} {r['list_plan0_s']:>9.3f} {r['list_plan1_s']:>11.3f}")
    first, last = min(results), max(results)
    if last > first:
        a, b = results[first], results[last]
        worst_a, worst_b = (max(r["health_max_ms"], r["open_max_ms"]) for r in (a, b))
        print(
            f"ratio {last}/{first}: register {b['register_s'] / a['register_s']:.1f}x, "
            f"worst hit wait {worst_b / worst_a:.1f}x"
        )
    if not any(r["loop"] for r in results.values()):
        return
    print(
        f"{'urls':>9} {'phase':>9} {'steps':>8} {'cpu p99':>9} {'cpu max':>9} {'wall max':>9} "
        f"{'>20ms':>6} {'gc max':>8}"
    )
    for n, r in results.items():
        for phase, s in r["loop"].items():
            print(
                f"{n:>9} {phase:>9} {s['steps']:>8} {s['cpu_p99_ms']:>7.2f}ms {s['cpu_max_ms']:>7.1f}ms "
                f"{s['wall_max_ms']:>7.1f}ms {s['over_20ms']:>6} {s['gc_max_ms']:>6.1f}ms"
            )
    for n, r in results.items():
        for phase, s in r["loop"].items():
            for line in s["worst"]:
                print(f"  {n} {phase}: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--baseline", type=Path, help="a checkout of main, measured in the same run")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every size and tree (tables each)")
    parser.add_argument("--no-trace", action="store_true", help="run the daemons on uvloop, loop untimed")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="scb-", dir="/tmp"))
    try:
        for repeat in range(args.repeats):
            suffix = f" (run {repeat + 1})" if args.repeats > 1 else ""
            run_all(args.sizes, args.baseline, work, suffix, trace=not args.no_trace)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run_all(sizes: list[int], baseline: Path | None, work: Path, suffix: str, trace: bool = True) -> None:
    """Every size against this tree (and the baseline, interleaved), then the tables and ratios."""
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if baseline is not None:
        trees.append((f"baseline {baseline}", baseline.resolve()))
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for n in sizes:
        for label, tree in trees:
            table.setdefault(label, {})[n] = run_one(n, tree, work, trace)
    for label, results in table.items():
        show(label + suffix, results)
    if baseline is not None:
        this, base = table["this tree"], table[trees[1][0]]
        print("\nthis / baseline (worst hit wait, register answer):")
        for n in sizes:
            worst = max(this[n]["health_max_ms"], this[n]["open_max_ms"])
            worst_base = max(base[n]["health_max_ms"], base[n]["open_max_ms"])
            print(
                f"{n:>9}: worst wait {worst / worst_base:.3f}x, "
                f"register {this[n]['register_s'] / base[n]['register_s']:.2f}x"
            )


if __name__ == "__main__":
    raise SystemExit(main())
