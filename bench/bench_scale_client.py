"""The client at a million shards: what one reader pays for its share of a large dataset (issue 25).

A synthetic tars dataset of n tiny shards (hard links to tiny 2-sample tars, made once in a cache directory
under /tmp and reused: `--cache`), read as one reader of W (`RuntimeContext(rank, world_size=W)`). Each
figure is measured in a fresh process per (n, W), so per-process caches count as they would in a real
reader, and is the median of `--repeats` such processes:

- `build`: `Dataset.from_source("tars", urls)` (turning n URLs into shard references; once per process);
- `first`: the first sample of epoch 0 without a daemon (this reader's planning of the epoch, then one
  tiny shard read): the cold cost of a reader's first epoch;
- `epoch`: the first sample of epoch 1 in the same process (`set_epoch(1)`): one more epoch's planning;
- `daemon`: the first sample through a real daemon (`--daemon`, W = 1,024 only unless `--daemon-w1`: a
  plan of every shard costs the daemon seconds at 10^6, which is the daemon's part of the issue);
- `load`: `Dataset.load_state_dict` of a state taken after one sample, on a fresh Dataset (median of 5);
- `uss`: a DataLoader worker's private memory (USS) after its first sample (rank W/2 of W, 2 fork workers,
  no daemon; a plain torch DataLoader, so without TorchLoader's frozen fork, `loader/fork_memory.py`, which
  matters once a worker runs a full garbage collection).

Ratios are the largest n over the smallest (for W = 1,024, the smallest n >= W), measured in this run
(the machine is shared and noisy). `--baseline DIR` runs the readers with DIR's client first (e.g. an export
of main: `git archive main client protocol daemon | tar -x -C DIR`), for before/after in one run.

    .venv/bin/python -m bench.bench_scale_client                         # n = 10^3, 10^4, 10^5
    .venv/bin/python -m bench.bench_scale_client --sizes 1000 1000000    # the 1M figures (makes the links)
    .venv/bin/python -m bench.bench_scale_client --sizes 1000 10000 --repeats 1 --no-uss   # quick
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "shardcache-bench-scale"


LINKS_PER_FILE = 50_000  # ext4 allows 65,000 hard links to one inode


def shard_urls(cache: Path, n: int) -> list[str]:
    """n shard paths, hard links to tiny 2-sample tars, made once (the first n of the cached directory)."""
    folder = cache / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    urls = [str(folder / f"shard_{i:07d}.tar") for i in range(n)]
    made = cache / "made.txt"
    have = int(made.read_text()) if made.exists() else 0
    if have < n:
        print(f"  making {n - have} links under {folder} (once)", flush=True)
        for i in range(have, n):
            template = cache / f"template_{i // LINKS_PER_FILE}.tar"
            if not template.exists():
                with tarfile.open(template, "w", format=tarfile.USTAR_FORMAT) as tar:
                    for j in range(2):
                        data = json.dumps({"i": j}).encode()
                        info = tarfile.TarInfo(f"s{j:02d}.json")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            if not os.path.exists(urls[i]):
                os.link(template, urls[i])
        made.write_text(str(n))
    return urls


def uss_mb(sample: dict[str, Any]) -> dict[str, Any]:
    """A map stage: the reading process's private memory (USS) in MB, on the sample."""
    import psutil

    return {"uss": psutil.Process().memory_full_info().uss / 1e6, "pid": os.getpid()}


def child(args: argparse.Namespace) -> dict[str, float]:
    """One fresh reader process: the figures of one (n, W) configuration."""
    from shardcache import Dataset, RuntimeContext

    urls = shard_urls(Path(args.cache), args.n)
    ctx = RuntimeContext(rank=args.world // 2, world_size=args.world, seed=0)
    out: dict[str, float] = {}
    if args.what == "uss":
        import torch.utils.data

        ds = Dataset.from_source("tars", urls, daemon=None, context=ctx).map(uss_mb)
        loader: Any = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=None)  # type: ignore[arg-type]
        seen: dict[int, float] = {}
        for sample in loader:
            seen[sample["pid"]] = sample["uss"]
            if len(seen) == 2:
                break
        out["uss"] = max(seen.values())
        return out
    daemon: Any = None if args.socket is None else args.socket
    started = time.perf_counter()
    ds = Dataset.from_source("tars", urls, daemon=daemon, context=ctx)
    out["build"] = time.perf_counter() - started
    started = time.perf_counter()
    it = iter(ds)
    next(it)
    out["daemon" if daemon else "first"] = time.perf_counter() - started
    if daemon:
        return out
    state = it.state_dict()
    ds.set_epoch(1)
    started = time.perf_counter()
    it2 = iter(ds)
    next(it2)
    out["epoch"] = time.perf_counter() - started
    del it, it2
    loads = []
    for _ in range(5):
        fresh = Dataset.from_source("tars", urls, daemon=None, context=ctx)
        started = time.perf_counter()
        fresh.load_state_dict(state)
        loads.append(time.perf_counter() - started)
    out["load"] = statistics.median(loads)
    return out


def run_child(
    cache: Path, n: int, world: int, what: str, socket: str | None = None, client: Path | None = None
) -> dict[str, float]:
    command = [sys.executable, "-m", "bench.bench_scale_client", "--child", what]
    command += ["--cache", str(cache), "--n", str(n), "--world", str(world)]
    if socket is not None:
        command += ["--socket", socket]
    env = dict(os.environ)
    if client is not None:  # the baseline's packages first, this checkout's bench after them
        parts = [str(client / p) for p in ("daemon", "client", "protocol")]
        env["PYTHONPATH"] = os.pathsep.join([*parts, str(ROOT)])
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def show(figures: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.1f} MB" if k == "uss" else f"{k} {v * 1e3:.1f} ms" for k, v in figures.items())


def ratio(key: str, a: float, b: float) -> str:
    if key == "uss":
        return f"{b / a:.2f}x (growth {b - a:+.1f} MB)"
    return f"{b / a:.1f}x ({b * 1e3:.1f} ms)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=str(DEFAULT_CACHE))
    parser.add_argument("--baseline", type=Path, help="a checkout whose client runs first (before/after)")
    parser.add_argument("--daemon", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--daemon-w1", action="store_true", help="also the first sample via the daemon at W=1"
    )
    parser.add_argument("--uss", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--child", choices=["plan", "daemon", "uss"], help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.what = args.child
        print(json.dumps(child(args)))
        return 0

    cache = Path(args.cache)
    shard_urls(cache, max(args.sizes))
    clients: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        clients = {"baseline": args.baseline.resolve(), **clients}
    results: dict[tuple[str, int, int], dict[str, float]] = {}
    daemon = None
    with tempfile.TemporaryDirectory(prefix="scb-") as tmp:
        if args.daemon:
            sys.path.insert(0, str(ROOT))
            from harness.devservers import start_daemon

            daemon = start_daemon(
                Path(tmp) / "d.sock",
                Path(tmp) / "cache",
                [str(cache)],
                capacity="1GiB",
                log=Path(tmp) / "d.log",
            )
        try:
            for n in args.sizes:
                for world in args.worlds:
                    if world > n:
                        continue  # fewer shards than readers: a tars source refuses it
                    for label, client in clients.items():
                        runs: dict[str, list[float]] = {}
                        for _ in range(args.repeats):
                            for key, value in run_child(cache, n, world, "plan", None, client).items():
                                runs.setdefault(key, []).append(value)
                            if daemon is not None and (world > 1 or args.daemon_w1):
                                got = run_child(cache, n, world, "daemon", str(daemon.socket), client)
                                runs.setdefault("daemon", []).append(got["daemon"])
                            if args.uss and n >= 2 * world:  # 2 workers per rank: 2W slots
                                runs.setdefault("uss", []).append(
                                    run_child(cache, n, world, "uss", None, client)["uss"]
                                )
                        results[label, n, world] = {k: statistics.median(v) for k, v in runs.items()}
                        print(
                            f"{label:>8} n={n:>8} W={world:>5}  {show(results[label, n, world])}", flush=True
                        )
        finally:
            if daemon is not None:
                daemon.stop()
    large = max(args.sizes)
    print("\nratios of the largest n over the smallest run (same run; the figure at the largest n):")
    for world in args.worlds:
        small = min(n for n in args.sizes if ("this", n, world) in results)
        for label in clients:
            a, b = results[label, small, world], results[label, large, world]
            shown = ", ".join(f"{key} {ratio(key, a[key], b[key])}" for key in b if key in a)
            print(f"  {label:>8} W={world:>5} n={large}/{small}: {shown}")
    if args.baseline is not None:
        print("\nthis / baseline at the largest n:")
        for world in args.worlds:
            a, b = results["baseline", large, world], results["this", large, world]
            print(f"  W={world:>5}: " + ", ".join(f"{key} {b[key] / a[key]:.3f}x" for key in b if key in a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
