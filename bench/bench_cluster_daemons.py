"""Cluster scale with real daemons: S3 egress of a simulated 4-node cluster over epochs, per placement.

One moto S3 server holds the dataset (tar shards of many small samples, unequal sample counts). Each
simulated node runs its own real `shardcached` (own cache dir, socket and metrics port; `--capacity` =
`headroom` x that node's share of the dataset in bytes under node placement), and each rank is its own
process reading through its node's daemon with an explicit `RuntimeContext` (a `required` daemon client: a
rank never reads S3 itself, so every byte read is counted by some daemon). The cluster, the daemons and the
rank processes are the ones `tests/cluster/` builds (`harness.cluster.NodeSet`,
`harness.cluster_ranks.run_cluster`).

Epochs run in lockstep (a barrier opens each one, as DDP steps would). Every mode starts fresh daemons with
empty caches over the same objects:
  node          placement="node", whole shards (even=None)
  global        placement="global" (a fresh global deal every epoch), whole shards
  node+drop     placement="node", even="drop" (the default under torch.distributed)
  node+x0.1     placement="node", exchange=0.1
Egress = the bytes all daemons fetched (`GET /v1/stats` bytes_fetched) / the dataset's bytes. Per epoch:
the bytes fetched while that epoch ran (prefetches for the next epoch may fall in it), and each node's hit
ratio (hits / opens in that epoch). Sample counts come with the shard list (a manifest's `num_samples`), so
even="drop" needs no counting pass, and node shares are balanced by samples in every mode.

Target (issue 12): node placement <= 1.05x the dataset in 3 epochs with caches 1.15x a node's share; global
placement reported beside it.

    .venv/bin/python -m bench.bench_cluster_daemons           # 64 shards of ~1 MiB, 4 nodes x 2 ranks
    .venv/bin/python -m bench.bench_cluster_daemons --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from harness.cluster import Node, NodeSet, rank_process_context
from harness.cluster_ranks import Rank, run_cluster
from harness.devservers import start_s3_server
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.shards import ShardRef
from shardcache.sources.deal.partition import owners, weights_of

DEADLINE_S = 600.0
MODES: dict[str, dict[str, Any]] = {
    "node": {"placement": "node"},
    "global": {"placement": "global"},
    "node+drop": {"placement": "node", "even": "drop"},
    "node+x0.1": {"placement": "node", "exchange": 0.1},
}


@dataclass(frozen=True)
class BenchRank(Rank):  # type: ignore[misc]  # (mypy does not see tests/cluster)
    """A cluster rank that also takes `even` (the test's Rank leaves it at "auto")."""

    even: str | None = None

    def dataset(self) -> Dataset:
        ctx = RuntimeContext(
            rank=self.rank, world_size=self.world_size, local_world_size=self.per_node, seed=self.seed
        )
        options: dict[str, Any] = {"placement": self.placement, "even": self.even}
        if self.exchange:
            options["exchange"] = self.exchange
        return Dataset.from_source(
            "tars",
            list(self.shards),
            context=ctx,
            daemon=DaemonClient(socket=self.socket, required=True),
            **options,
        )


@dataclass(frozen=True)
class Data:
    refs: tuple[ShardRef, ...]  # with size and num_samples (what a manifest gives)
    keys: Counter[str]

    @property
    def total_bytes(self) -> int:
        return sum(ref.size or 0 for ref in self.refs)

    @property
    def prefix(self) -> str:
        return self.refs[0].url.rsplit("/", 1)[0] + "/"


def samples_in(shard: int, mean: int) -> int:
    """Unequal counts: from mean/2 to about 3*mean/2 samples."""
    return mean // 2 + (shard * 53) % (mean + 1)


def write_shard(path: Path, shard: int, samples: int, sample_bytes: int, rng: random.Random) -> list[str]:
    """A tar shard of `samples` samples: `<key>.bin` (0.5-1.5x sample_bytes random bytes) and `<key>.json`."""
    keys = []
    with tarfile.open(path, "w") as tar:
        for i in range(samples):
            key = f"s{shard:04d}_{i:05d}"
            keys.append(key)
            body = rng.randbytes(rng.randint(sample_bytes // 2, sample_bytes * 3 // 2))
            meta = json.dumps({"shard": shard, "index": i}).encode()
            for suffix, data in (("bin", body), ("json", meta)):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return keys


def upload(endpoint: str, local: Path, shards: int, mean: int, sample_bytes: int) -> Data:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"cluster-bench-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    rng = random.Random(0)
    refs = []
    keys: Counter[str] = Counter()
    for i in range(shards):
        name = f"shard_{i:05d}.tar"
        count = samples_in(i, mean)
        keys.update(write_shard(local / name, i, count, sample_bytes, rng))
        s3.upload_file(str(local / name), bucket, f"shards/{name}")
        size = (local / name).stat().st_size
        refs.append(ShardRef(f"s3://{bucket}/shards/{name}", size=size, num_samples=count))
        (local / name).unlink()
    return Data(tuple(refs), keys)


def node_shares(data: Data, nodes: int) -> list[set[str]]:
    """Each node's shard URLs under node placement (the client's own assignment, seed 0)."""
    weights = weights_of([r.num_samples for r in data.refs], [r.size for r in data.refs])
    owner = owners(weights, nodes, 0)
    return [{r.url for r, o in zip(data.refs, owner, strict=True) if o == k} for k in range(nodes)]


def share_bytes(data: Data, share: set[str]) -> int:
    return sum(r.size or 0 for r in data.refs if r.url in share)


def settled(nodes: list[Node]) -> list[dict[str, Any]]:
    """Every node's stats once no fetch is in flight (prefetches finish or give up), within a deadline."""
    deadline = time.monotonic() + 60
    while True:
        stats = [node.stats() for node in nodes]
        if all(s["fetches_in_flight"] == 0 for s in stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@dataclass
class EpochFigures:
    egress: float  # bytes fetched during the epoch / dataset bytes
    hit_ratio: list[float]  # per node, opens in this epoch
    read: int  # samples read by all ranks
    twice: int  # samples read more than once
    left_out: int  # samples of the dataset nobody read


def run_mode(
    data: Data,
    root: Path,
    shares: list[set[str]],
    per_node: int,
    mode: dict[str, Any],
    epochs: int,
    headroom: float,
) -> tuple[list[EpochFigures], list[set[str]]]:
    """Fresh daemons, every rank a process, `epochs` epochs in lockstep: figures per epoch, and each node's
    resident shards outside its node share at the end."""
    root.mkdir(parents=True)
    nodeset = NodeSet(root)
    context = rank_process_context()
    figures: list[EpochFigures] = []
    try:
        nodes = nodeset.start([int(headroom * share_bytes(data, s)) for s in shares], [data.prefix])
        world = len(nodes) * per_node
        ranks = [
            BenchRank(r, world, per_node, nodes[r // per_node].socket, data.refs, **mode)
            for r in range(world)
        ]
        before = settled(nodes)

        def after_epoch(epoch: int, got: dict[int, list[str]]) -> None:
            nonlocal before
            after = settled(nodes)
            seen = Counter(k for keys in got.values() for k in keys)
            fetched = sum(a["bytes_fetched"] - b["bytes_fetched"] for a, b in zip(after, before, strict=True))
            hits = [
                (a["hits"] - b["hits"]) / max(1, a["hits"] + a["misses"] - b["hits"] - b["misses"])
                for a, b in zip(after, before, strict=True)
            ]
            figures.append(
                EpochFigures(
                    fetched / data.total_bytes,
                    hits,
                    sum(seen.values()),
                    sum((seen - data.keys).values()),
                    len(data.keys - seen),
                )
            )
            before = after

        run_cluster(context, list(ranks), epochs, after_epoch, DEADLINE_S)
        foreign = [
            {s["url"] for s in node.shards()} - share for node, share in zip(nodes, shares, strict=True)
        ]
        return figures, foreign
    finally:
        nodeset.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--samples", type=int, default=256, help="mean samples per shard (from half to 1.5x)")
    parser.add_argument("--sample-bytes", type=int, default=2560, help="mean payload per sample")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--headroom", type=float, default=1.15, help="each cache: this x its node's share")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to quote")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.samples, args.sample_bytes, args.epochs = 16, 64, 1024, 2
    started = time.monotonic()
    server = start_s3_server()
    os.environ.update(server.env)  # boto3 here and every daemon's s3fs read the endpoint and credentials
    try:
        with tempfile.TemporaryDirectory(prefix="cluster-bench-") as workdir:
            root = Path(workdir)
            (root / "data").mkdir()
            data = upload(server.endpoint, root / "data", args.shards, args.samples, args.sample_bytes)
            shares = node_shares(data, args.nodes)
            counts = [r.num_samples or 0 for r in data.refs]
            print(
                f"dataset: {len(data.refs)} tar shards, {sum(counts):,} samples "
                f"({min(counts)}..{max(counts)} per shard), {data.total_bytes / 2**20:.1f} MiB; "
                f"{args.nodes} nodes x {args.ranks_per_node} ranks (processes), {args.epochs} epochs",
                flush=True,
            )
            print(
                "node shares (shards, MiB) and caches: "
                + ", ".join(
                    f"n{k} {len(s)} / {share_bytes(data, s) / 2**20:.2f} -> "
                    f"{args.headroom * share_bytes(data, s) / 2**20:.2f}"
                    for k, s in enumerate(shares)
                ),
                flush=True,
            )
            hit_head = "".join(f"{'hit n' + str(k):>8}" for k in range(args.nodes))
            print(
                f"{'mode':<11}{'epoch':>6}{'egress':>9}{'total':>9}{hit_head}{'read':>8}{'twice':>7}{'left':>6}"
            )
            summary = []
            for mode in args.modes:
                mode_started = time.monotonic()
                figures, foreign = run_mode(
                    data,
                    root / mode.replace("+", "_"),
                    shares,
                    args.ranks_per_node,
                    MODES[mode],
                    args.epochs,
                    args.headroom,
                )
                total = 0.0
                for epoch, f in enumerate(figures):
                    total += f.egress
                    hits = "".join(f"{h:>8.3f}" for h in f.hit_ratio)
                    print(
                        f"{mode:<11}{epoch:>6}{f.egress:>8.3f}x{total:>8.3f}x{hits}"
                        f"{f.read:>8}{f.twice:>7}{f.left_out:>6}",
                        flush=True,
                    )
                summary.append((mode, total, foreign, time.monotonic() - mode_started))
            print(f"\nS3 egress over {args.epochs} epochs / dataset (caches {args.headroom}x a node's share)")
            for mode, total, foreign, seconds in summary:
                verdict = ""
                if mode == "node":
                    verdict = "  target <= 1.05x: " + ("met" if total <= 1.05 else "MISSED")
                outside = sum(share_bytes(data, urls) for urls in foreign) / data.total_bytes
                print(
                    f"  {mode:<11}{total:>7.3f}x  resident outside the node's share at the end: "
                    f"{[len(urls) for urls in foreign]} shards, {outside:.3f}x the dataset  "
                    f"({seconds:.0f}s){verdict}"
                )
    finally:
        server.stop()
    print(f"{time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
