"""A process group's node layout from its ranks' hosts (`shardcache.topology.hosts`).

The layout of a list of hosts is a pure function. The exchange runs for real: gloo process groups whose
ranks are started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: no launcher variable says how many
ranks share a node), each rank in a UTS namespace of its own whose host name names its simulated node
(`harness.cluster.on_host`; root only), running `tests/client/workers/layout_worker.py`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import hosts_unavailable, on_host
from harness.devservers import free_tcp_port
from harness.tools import unavailable
from shardcache.topology.hosts import BOOT_ID, host_key, layout_of_hosts
from shardcache.topology.launchers import NodeLayout

REPO = Path(__file__).resolve().parents[3]
WORKER = REPO / "tests" / "client" / "workers" / "layout_worker.py"
DEADLINE_S = 90.0


def test_ranks_on_the_same_host_share_a_node_numbered_by_its_lowest_rank() -> None:
    hosts = ["b", "b", "a", "a", "c", "c"]
    assert layout_of_hosts(hosts, 3).layout == NodeLayout(2, 3, 1, 1, "process group")
    assert layout_of_hosts(hosts, 4).layout == NodeLayout(2, 3, 0, 2, "process group")


def test_ranks_numbered_across_hosts_keep_each_host_as_a_node() -> None:
    hosts = ["a", "b", "a", "b"]
    assert layout_of_hosts(hosts, 1).layout == NodeLayout(2, 2, 0, 1, "process group")
    assert layout_of_hosts(hosts, 2).layout == NodeLayout(2, 2, 1, 0, "process group")


def test_hosts_with_different_numbers_of_ranks_give_no_layout_and_name_the_counts() -> None:
    outcome = layout_of_hosts(["x/node-0", "x/node-0", "x/node-1"], 0)
    assert outcome.layout is None
    assert outcome.problem is not None and "node-0: 2, node-1: 1" in outcome.problem


def test_the_host_key_is_the_boot_id_and_the_host_name() -> None:
    assert host_key() == f"{BOOT_ID.read_text().strip()}/{socket.gethostname()}"


@pytest.fixture
def simulated_hosts() -> None:
    reason = hosts_unavailable()
    if reason is not None:
        unavailable(reason)


def test_another_uts_namespace_is_another_host(simulated_hosts: None) -> None:
    code = "from shardcache.topology.hosts import host_key; print(host_key())"
    seen = subprocess.run(
        on_host("node-7", [sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    other = seen.stdout.strip()
    assert other != host_key() and other.endswith("/node-7")
    assert other.split("/")[0] == host_key().split("/")[0]  # the same machine, booted once


def launch(hosts: Sequence[str], out: Path, *args: str, env: dict[str, str] | None = None) -> list[Any]:
    """One layout_worker per rank, rank r on host hosts[r]; every rank's report."""
    port = free_tcp_port()
    base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(hosts)),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE"):
        base.pop(name, None)
    logs = [out / f"rank{r}.log" for r in range(len(hosts))]
    procs = []
    for rank, host in enumerate(hosts):
        command = on_host(host, [sys.executable, str(WORKER), "--out", str(out), *args])
        with logs[rank].open("w") as log:
            procs.append(
                subprocess.Popen(
                    command, env={**base, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT
                )
            )
    try:
        for proc in procs:
            proc.wait(DEADLINE_S)
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
    finally:
        for proc in procs:
            proc.wait()
    output = "\n".join(f"--- rank {r}:\n{log.read_text()}" for r, log in enumerate(logs))
    assert all(proc.returncode == 0 for proc in procs), f"a rank failed:\n{output}"
    return [
        json.loads((out / f"rank{r}.json").read_text()) | {"log": logs[r].read_text()}
        for r in range(len(hosts))
    ]


@pytest.mark.slow
def test_a_process_group_learns_its_nodes_from_its_ranks_hosts_in_workers_too(
    simulated_hosts: None, tmp_path: Path
) -> None:
    reports = launch(["node-0", "node-0", "node-1", "node-1"], tmp_path)
    for rank, report in enumerate(reports):
        # rank, world_size, local_rank, local_world_size, node_rank, num_nodes
        expected = [rank, 4, rank % 2, 2, rank // 2, 2]
        for where in ("trainer", "again", "fork", "spawn"):
            assert report[where] == expected, f"rank {rank}, {where}: {report[where]}\n{report['log']}"
        assert "WARNING" not in report["log"]


@pytest.mark.slow
def test_hosts_with_unequal_ranks_count_as_one_node_on_every_rank_with_a_warning(
    simulated_hosts: None, tmp_path: Path
) -> None:
    reports = launch(["node-0", "node-0", "node-1"], tmp_path, "--workers", "")
    for rank, report in enumerate(reports):
        assert report["trainer"] == report["again"] == [rank, 3, rank, 3, 0, 1]
        assert report["log"].count("WARNING") == 1, report["log"]
        assert "node-0: 2, node-1: 1" in report["log"]


@pytest.mark.slow
def test_a_rank_resolving_alone_does_not_hang_and_every_rank_then_counts_one_node(
    simulated_hosts: None, tmp_path: Path
) -> None:
    # Rank 0 resolves while the others sit in a barrier: it gives up after SHARDCACHE_LAYOUT_WAIT_S, and
    # the ranks that resolve later, though every host is known by then, abide by its decision.
    reports = launch(
        ["node-0", "node-1"], tmp_path, "--alone", "--workers", "fork", env={"SHARDCACHE_LAYOUT_WAIT_S": "2"}
    )
    for rank, report in enumerate(reports):
        assert report["trainer"] == report["again"] == report["fork"] == [rank, 2, rank, 2, 0, 1]
        assert report["log"].count("WARNING") == 1, report["log"]
        assert "SHARDCACHE_LAYOUT_WAIT_S" in report["log"]
