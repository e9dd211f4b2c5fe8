"""Node placement holds whoever launched the job: Lightning, srun, torchrun, on two simulated nodes.

Each node has its own real daemon (own cache dir and socket, a cache 1.15x its node's share), both fetch
from one moto S3 endpoint, and every rank reads with the defaults a user gets (`placement="auto"`, its
context from the launcher): 2 nodes x 2 ranks, 3 epochs (`harness.launches`). Before, none of these jobs
told the client its node layout (torchrun's aside), so each counted as one node and read with global
placement: every node's daemon fetched shards of the whole dataset each epoch. Now every job downloads
the dataset about once (at most 1.05x: under `even="drop"`, the default with a process group, the shard
where a node's share ends is read by two nodes), and each epoch still reads every sample once.

- Lightning `Trainer(num_nodes=2, devices=2)`, one launch per node with NODE_RANK 0 and 1 and MASTER_ADDR/
  MASTER_PORT, each node in a UTS namespace of its own (host `node-0`, `node-1`): Lightning does not say
  how many ranks a node runs, so the hosts the ranks exchange through the process group tell.
- srun: the tasks `srun -N 2 --ntasks-per-node 2` starts, with Slurm's variables only; with a gloo
  process group (as a DDP script) and without one (ranks from SLURM_PROCID and SLURM_NTASKS).
- torchrun --nnodes 2, two invocations (--node-rank 0 and 1) meeting at a rendezvous on 127.0.0.1.

Every process runs under a watchdog (its stacks, and the test fails, past the deadline).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import ClusterData, Node, hosts_unavailable, settled_egress
from harness.launches import LAUNCHERS, Process, rank_reports, write_manifest
from harness.tools import unavailable
from harness.watchdog import Watched, kill_tree

NODES = 2
PER_NODE = 2
WORLD = NODES * PER_NODE
EPOCHS = 3
DEADLINE_S = 180.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

StartNodes = Callable[[list[int], list[str]], list[Node]]


def run_all(processes: list[Process]) -> None:
    """Every process at once, each under the watchdog; all must exit 0 (else their output is shown)."""
    watched = [Watched(p.command, DEADLINE_S, env=p.env) for p in processes]
    try:
        done = [w.finish() for w in watched]
    finally:
        for w in watched:
            if w.proc.poll() is None:
                kill_tree(w.proc.pid)
    failed = [(p.name, d) for p, d in zip(processes, done, strict=True) if d.returncode != 0]
    shown = (f"--- {name} exited {d.returncode}:\n{d.stdout[-6000:]}" for name, d in failed)
    assert not failed, "\n".join(shown)


def run_job(
    launcher: str, data: ClusterData, start_nodes: StartNodes, out: Path, *args: str
) -> tuple[list[dict[str, Any]], float]:
    """The job on two fresh nodes; every rank's report, and the S3 egress as a multiple of the dataset."""
    nodes = start_nodes(data.capacities(NODES), [data.prefix])
    manifest = write_manifest(data.refs, out / "shards.manifest.jsonl")
    script = ["--manifest", str(manifest), "--out", str(out / "reports"), "--epochs", str(EPOCHS), *args]
    run_all(LAUNCHERS[launcher]([node.socket for node in nodes], PER_NODE, script))
    ratio = settled_egress(nodes) / data.total_bytes
    print(f"\n{launcher} {' '.join(args)}: S3 egress over {EPOCHS} epochs {ratio:.3f}x the dataset")
    return rank_reports(out / "reports", WORLD), ratio


def assert_two_nodes(reports: list[dict[str, Any]]) -> None:
    for rank, report in enumerate(reports):
        # rank, world_size, local_rank, local_world_size, node_rank, num_nodes
        assert report["layout"] == [rank, WORLD, rank % PER_NODE, PER_NODE, rank // PER_NODE, NODES]


def assert_each_epoch_reads_the_dataset_once(
    data: ClusterData, reports: list[dict[str, Any]], *, lost_at_most: int = 0
) -> None:
    for epoch in range(EPOCHS):
        seen = Counter(key for report in reports for key in report["epochs"][epoch])
        assert not seen - data.keys, f"epoch {epoch}: read twice or unknown: {seen - data.keys}"
        assert sum((data.keys - seen).values()) <= lost_at_most, f"epoch {epoch}: lost {data.keys - seen}"


def test_lightning_on_two_nodes_learns_them_from_the_hosts_and_downloads_the_dataset_once(
    cluster_data: ClusterData, start_nodes: StartNodes, tmp_path: Path
) -> None:
    if importlib.util.find_spec("pytorch_lightning") is None:
        unavailable("pytorch_lightning is not installed (the dev extra pins it)")
    reason = hosts_unavailable()
    if reason is not None:
        unavailable(reason)
    reports, ratio = run_job("lightning", cluster_data, start_nodes, tmp_path)
    assert_two_nodes(reports)
    assert_each_epoch_reads_the_dataset_once(cluster_data, reports, lost_at_most=WORLD - 1)
    assert ratio <= 1.05, f"Lightning on 2 nodes downloaded {ratio:.3f}x the dataset"


@pytest.mark.parametrize("group", [True, False], ids=["gloo process group", "no process group"])
def test_srun_tasks_on_two_nodes_read_their_layout_from_slurm_and_download_the_dataset_once(
    cluster_data: ClusterData, start_nodes: StartNodes, tmp_path: Path, group: bool
) -> None:
    reports, ratio = run_job("srun", cluster_data, start_nodes, tmp_path, *(["--group"] if group else []))
    assert_two_nodes(reports)
    assert_each_epoch_reads_the_dataset_once(cluster_data, reports, lost_at_most=WORLD - 1 if group else 0)
    assert ratio <= (1.05 if group else 1.0), f"srun on 2 nodes downloaded {ratio:.3f}x the dataset"


def test_torchrun_on_two_nodes_downloads_the_dataset_once(
    cluster_data: ClusterData, start_nodes: StartNodes, tmp_path: Path
) -> None:
    reports, ratio = run_job("torchrun", cluster_data, start_nodes, tmp_path, "--group")
    assert_two_nodes(reports)
    assert_each_epoch_reads_the_dataset_once(cluster_data, reports, lost_at_most=WORLD - 1)
    assert ratio <= 1.05, f"torchrun on 2 nodes downloaded {ratio:.3f}x the dataset"
