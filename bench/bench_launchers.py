"""S3 egress of a 2-node job as each launcher starts it: torchrun, srun (with and without a process group),
Lightning's own launcher; the default placement against global placement, in the same run.

Before the client learned the node layout from every launcher, it read only torchrun's LOCAL_WORLD_SIZE:
a job started by srun or by Lightning's `Trainer(num_nodes=2)` counted as one node, so `placement="auto"`
read as global placement. The baseline here is that: every launch again with `placement="global"` (what
"auto" resolved to for those jobs). Each launch: two simulated nodes, each its own real `shardcached` (cache
1.15x its node's share of the dataset's bytes), one moto S3 server, 2 ranks per node, every rank reading
through its node's daemon (`harness.launches`; Lightning's nodes each in a UTS namespace of its own, so
root is needed for it). Egress = bytes all daemons fetched / the dataset's bytes, over all epochs. The
layout column is what the ranks' contexts resolved (nodes x ranks per node).

`--before DIR` also runs every job with placement="auto" on the client of another checkout (its `client/`
first on the ranks' PYTHONPATH; the daemons stay this checkout's), e.g. the commit before this change:

    .venv/bin/python -m bench.bench_launchers              # 48 shards, 3 epochs, every launcher
    .venv/bin/python -m bench.bench_launchers --quick      # a smoke run (torchrun and srun, 2 epochs)
    mkdir /tmp/before && git archive <commit> client | tar -x -C /tmp/before
    .venv/bin/python -m bench.bench_launchers --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import boto3

from harness.cluster import NodeSet, hosts_unavailable, settled_egress, upload_cluster_data
from harness.devservers import start_s3_server
from harness.launches import LAUNCHERS, run_processes, write_manifest
from harness.shards import make_tar_shard
from shardcache.shards import ShardRef

# (name, launcher, reader arguments)
JOBS = {
    "torchrun": ("torchrun", ["--group"]),
    "srun+group": ("srun", ["--group"]),
    "srun": ("srun", []),
    "lightning": ("lightning", []),
}
DEADLINE_S = 600.0


def run(
    job: str,
    placement: str,
    root: Path,
    refs: Sequence[ShardRef],
    capacities: list[int],
    prefix: str,
    epochs: int,
    client: Path | None = None,
) -> tuple[float, str, float]:
    """(egress / dataset, layout seen, seconds) of one launch on fresh daemons."""
    launcher, extra = JOBS[job]
    root.mkdir(parents=True)
    nodeset = NodeSet(root)
    started = time.monotonic()
    try:
        nodes = nodeset.start(capacities, [prefix])
        manifest = write_manifest(refs, root / "shards.manifest.jsonl")
        args = ["--manifest", str(manifest), "--out", str(root / "reports"), "--epochs", str(epochs)]
        args += ["--placement", placement, *extra]
        processes = LAUNCHERS[launcher]([n.socket for n in nodes], 2, args)
        if client is not None:
            for process in processes:
                process.env["PYTHONPATH"] = f"{client / 'client'}{os.pathsep}{process.env['PYTHONPATH']}"
        for process, (code, output) in zip(processes, run_processes(processes, DEADLINE_S), strict=True):
            if code != 0:
                raise RuntimeError(f"{process.name} exited {code}:\n{output[-4000:]}")
        total = sum(ref.size or 0 for ref in refs)
        ratio = settled_egress(nodes) / total
        # Every rank's nodes x ranks per node; a client that took each srun task for rank 0 of 1 shows
        # "1 x 1" (each task wrote the one report in turn).
        reports = [json.loads(path.read_text()) for path in (root / "reports").glob("rank*.json")]
        seen = ", ".join(
            f"{n} x {per}" for n, per in sorted({(r["layout"][5], r["layout"][3]) for r in reports})
        )
        return ratio, seen, time.monotonic() - started
    finally:
        nodeset.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to quote")
    parser.add_argument("--before", type=Path, default=None, help="a checkout whose client to run as well")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.epochs, args.jobs = 16, 2, ["torchrun", "srun"]
    if "lightning" in args.jobs and hosts_unavailable() is not None:
        print(f"leaving out lightning: {hosts_unavailable()}")
        args.jobs.remove("lightning")
    started = time.monotonic()
    server = start_s3_server()
    os.environ.update(server.env)  # boto3 here and every daemon's s3fs read the endpoint and credentials
    try:
        with tempfile.TemporaryDirectory(prefix="launchers-bench-") as workdir:
            root = Path(workdir)
            (root / "data").mkdir()
            s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
            data = upload_cluster_data(
                s3, f"launchers-{os.getpid()}", root / "data", make_tar_shard, args.shards
            )
            print(
                f"dataset: {len(data.refs)} tar shards, {sum(data.keys.values()):,} samples, "
                f"{data.total_bytes / 2**20:.1f} MiB; 2 nodes x 2 ranks, {args.epochs} epochs, caches 1.15x "
                "a node's share",
                flush=True,
            )
            print(f"{'job':<12}{'placement':<14}{'layout seen':<14}{'egress':>9}{'time':>8}", flush=True)
            results: dict[tuple[str, str], float] = {}
            runs = [
                ("global", None),
                *([("before", args.before.resolve())] if args.before else []),
                ("auto", None),
            ]
            for job in args.jobs:
                for label, client in runs:
                    placement = "global" if label == "global" else "auto"
                    ratio, seen, seconds = run(
                        job,
                        placement,
                        root / f"{job}-{label}".replace("+", "_"),
                        data.refs,
                        data.capacities(2),
                        data.prefix,
                        args.epochs,
                        client,
                    )
                    results[job, label] = ratio
                    shown = "auto (before)" if label == "before" else placement
                    print(f"{job:<12}{shown:<14}{seen:<14}{ratio:>8.3f}x{seconds:>7.0f}s", flush=True)
            print("\nS3 egress over the epochs / dataset: placement='auto' against 'global' (and --before's)")
            for job in args.jobs:
                auto, spread = results[job, "auto"], results[job, "global"]
                verdict = "met" if auto <= 1.05 else "MISSED"
                before = f", before {results[job, 'before']:.3f}x" if args.before else ""
                print(
                    f"  {job:<12} {auto:.3f}x  (global {spread:.3f}x: {auto / spread:.2f}x{before})  "
                    f"<= 1.05x: {verdict}"
                )
    finally:
        server.stop()
    print(f"{time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
