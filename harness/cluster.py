"""A simulated cluster: one moto S3 endpoint, one real daemon per node (own cache dir, socket and metrics
port), and ranks as processes reading through their node's daemon.

Used by tests/cluster/ and bench/bench_cluster_daemons.py: `upload_cluster_data` (tar shards of
unequal sizes in a fresh bucket, with their sizes and sample keys), `NodeSet` (per-node daemons, started in
parallel, stopped together), `rank_process_context` (what rank processes start from) and `on_host` (a
command on a simulated node of its own host name, for launches whose ranks learn their node from it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.devservers import Daemon, start_daemon
from harness.start_methods import DEFAULT, process_context
from shardcache.shards import ShardRef
from shardcache.sources.deal.partition import owners, weights_of

SHARDS = 48


def samples_in(shard: int) -> int:
    return 8 + (shard * 7) % 17  # 8..24 samples of ~7.5 KiB: shards of ~60-180 KiB


@dataclass(frozen=True)
class ClusterData:
    """Tar shards in one bucket: their refs (with sizes, so node shares balance by bytes) and sample keys."""

    bucket: str
    refs: tuple[ShardRef, ...]
    keys: Counter[str]

    @property
    def total_bytes(self) -> int:
        return sum(ref.size or 0 for ref in self.refs)

    @property
    def prefix(self) -> str:
        return f"s3://{self.bucket}/"

    def node_shares(self, nodes: int) -> list[set[str]]:
        """Each node's shard URLs under node placement (balanced by bytes: the refs carry sizes)."""
        weights = weights_of([None] * len(self.refs), [ref.size for ref in self.refs])
        owner = owners(weights, nodes, 0)
        return [{ref.url for ref, o in zip(self.refs, owner, strict=True) if o == k} for k in range(nodes)]

    def share_bytes(self, share: set[str]) -> int:
        return sum(ref.size or 0 for ref in self.refs if ref.url in share)

    def capacities(self, nodes: int, headroom: float = 1.15) -> list[int]:
        """Each node's daemon capacity: `headroom` x its share of the dataset's bytes."""
        return [int(headroom * self.share_bytes(share)) for share in self.node_shares(nodes)]


def upload_cluster_data(
    s3_client: Any, bucket: str, local: Path, make_tar_shard: Any, shards: int = SHARDS
) -> ClusterData:
    """Write `shards` tar shards under `local` and upload them to a new `bucket` under shards/."""
    s3_client.create_bucket(Bucket=bucket)
    refs = []
    keys: Counter[str] = Counter()
    for i in range(shards):
        name = f"shard_{i:04d}.tar"
        keys.update(make_tar_shard(local / name, i, samples_in(i), payload_bytes=6 * 1024))
        s3_client.upload_file(str(local / name), bucket, f"shards/{name}")
        refs.append(ShardRef(f"s3://{bucket}/shards/{name}", size=(local / name).stat().st_size))
    return ClusterData(bucket, tuple(refs), keys)


class Node:
    """One simulated node: its daemon and an HTTP client on its socket."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.http = httpx.Client(
            transport=httpx.HTTPTransport(uds=daemon.socket), base_url="http://shardcached", timeout=60
        )

    @property
    def socket(self) -> str:
        return self.daemon.socket

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/v1/stats").json())

    def plans(self) -> list[dict[str, Any]]:
        return list(self.http.get("/v1/plans").json())

    def shards(self) -> list[dict[str, Any]]:
        return list(self.http.get("/v1/shards").json()["shards"])

    def stop(self) -> None:
        self.http.close()
        self.daemon.stop()


def egress(nodes: list[Node]) -> int:
    """The bytes every node's daemon fetched from the remote so far."""
    return sum(int(node.stats()["bytes_fetched"]) for node in nodes)


def settled_egress(nodes: list[Node], deadline_s: float = 60.0) -> int:
    """`egress` once no daemon has a fetch in flight (a prefetch finishing after its readers left), polled
    until `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while any(node.stats()["fetches_in_flight"] for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return egress(nodes)


class NodeSet:
    """Per-node daemons under one directory: each its own cache dir, socket and metrics port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sockets = Path(tempfile.mkdtemp(prefix="scc-", dir="/tmp"))  # socket paths must stay short
        self.nodes: list[Node] = []

    def start(self, capacities: list[int], allow: list[str]) -> list[Node]:
        """One daemon per capacity (bytes), started in parallel."""
        first = len(self.nodes)

        def one(k: int) -> Node:
            n = first + k
            daemon = start_daemon(
                self.sockets / f"n{n}.sock",
                self.root / f"cache{n}",
                allow,
                capacity=f"{capacities[k]}B",
                log=self.root / f"daemon{n}.log",
            )
            return Node(daemon)

        with ThreadPoolExecutor(len(capacities)) as pool:
            started = list(pool.map(one, range(len(capacities))))
        self.nodes.extend(started)
        return started

    def stop(self) -> None:
        """Stop every daemon (in parallel: each waits out its graceful shutdown)."""
        if self.nodes:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(Node.stop, self.nodes))
        shutil.rmtree(self.sockets, ignore_errors=True)


def rank_process_context(method: str = DEFAULT) -> Any:
    """The multiprocessing context rank processes start from: by default multiprocessing's default (fork on
    Linux), like DataLoader workers a user starts without choosing, so a rank inherits a process that has
    already imported shardcache and talked to daemons. The cluster tests run only this one: each takes
    about 10 s, and the start methods are covered by the loader tests (harness/start_methods.py)."""
    return process_context(method)


def hosts_unavailable() -> str | None:
    """Why `on_host` cannot run here (no `unshare`, or no right to make a UTS namespace), else None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run([unshare, "--uts", "hostname", "probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a UTS namespace (root needed): {probe.stderr.strip()}"
    return None


def on_host(name: str, command: Sequence[str]) -> list[str]:
    """`command` in a UTS namespace of its own whose host name is `name`: a simulated node, as the ranks
    that exchange their hosts see it (the processes it starts share the namespace, as a node's ranks share
    its host). Needs root (see `hosts_unavailable`)."""
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *command]
