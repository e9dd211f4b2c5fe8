"""A simulated cluster with real parts: one moto S3 endpoint, one real daemon per node (each with its own
cache dir, socket and metrics port), and every rank a process reading through its own node's daemon.

4 nodes x 2 ranks, each node's cache 1.15x its share of the dataset, 3 epochs: with node placement the
cluster downloads the dataset about once; with global placement every node needs other shards each epoch;
exchange=0.1 costs about a tenth of the dataset per later epoch. A checkpoint mid-epoch resumes on 3 nodes
and (from 2) on 4 nodes with nothing lost or read twice.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from harness.cluster import ClusterData, Node, NodeSet, egress, rank_process_context
from harness.cluster_ranks import Rank, read_part, read_rest, run_cluster
from shardcache import merge_states

PER_NODE = 2
EPOCHS = 3
DEADLINE_S = 120.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rank_processes() -> Any:
    return rank_process_context()


def ranks_on(data: ClusterData, nodes: list[Node], per_node: int, placement: str = "auto") -> list[Rank]:
    world = len(nodes) * per_node
    return [Rank(r, world, per_node, nodes[r // per_node].socket, data.refs, placement) for r in range(world)]


def start_cluster(data: ClusterData, start: Callable[[list[int], list[str]], list[Node]]) -> list[Node]:
    """4 nodes, each daemon's capacity 1.15x its node's share of the dataset's bytes."""
    return start(data.capacities(4), [data.prefix])


def exactly_once(data: ClusterData) -> Callable[[int, dict[int, list[str]]], None]:
    def check(epoch: int, keys: dict[int, list[str]]) -> None:
        assert Counter(k for rank_keys in keys.values() for k in rank_keys) == data.keys, f"epoch {epoch}"

    return check


def test_node_placement_downloads_the_dataset_about_once_and_each_daemon_holds_its_nodes_plans(
    cluster_data: ClusterData, start_nodes: Any, rank_processes: Any
) -> None:
    shares = cluster_data.node_shares(4)
    nodes = start_cluster(cluster_data, start_nodes)
    urls_of = {f"s{i:04d}": ref.url for i, ref in enumerate(cluster_data.refs)}
    held: list[list[dict[str, Any]]] = []
    once = exactly_once(cluster_data)

    def check(epoch: int, keys: dict[int, list[str]]) -> None:
        once(epoch, keys)
        for plans in held:  # the plans registered during the last epoch for this one, as long as it read
            for plan in plans:
                read = [urls_of[key[:5]] for key in keys[plan["slot"]]]
                assert plan["len"] == len([url for url, _ in itertools.groupby(read)])
        held.clear()
        for k, node in enumerate(nodes):
            plans = node.plans()
            # Between epochs each slot of this node holds its next epoch's plan, and no other node's slot
            # has a plan here; what the plans name ahead is exactly this node's share.
            assert sorted(p["slot"] for p in plans) == [PER_NODE * k + j for j in range(PER_NODE)]
            assert {p["epoch"] for p in plans} == {epoch + 1}
            assert {s["url"] for s in node.shards() if s["next_use"] is not None} == shares[k]
            held.append(plans)

    run_cluster(rank_processes, ranks_on(cluster_data, nodes, PER_NODE, "node"), EPOCHS, check)
    ratio = egress(nodes) / cluster_data.total_bytes
    print(f"cluster S3 egress, node placement, {EPOCHS} epochs: {ratio:.3f}x the dataset")
    assert ratio <= 1.10, f"node placement downloaded {ratio:.3f}x the dataset"
    for node, share in zip(nodes, shares, strict=True):
        assert {s["url"] for s in node.shards()} <= share  # a node only ever fetched its own shards


def test_global_placement_downloads_clearly_more(
    cluster_data: ClusterData, start_nodes: Any, rank_processes: Any
) -> None:
    nodes = start_cluster(cluster_data, start_nodes)
    run_cluster(
        rank_processes, ranks_on(cluster_data, nodes, PER_NODE, "global"), EPOCHS, exactly_once(cluster_data)
    )
    ratio = egress(nodes) / cluster_data.total_bytes
    print(f"cluster S3 egress, global placement, {EPOCHS} epochs: {ratio:.3f}x the dataset")
    assert ratio >= 1.5, f"global placement downloaded only {ratio:.3f}x the dataset"


def test_exchange_downloads_about_that_fraction_more_per_epoch(
    cluster_data: ClusterData, start_nodes: Any, rank_processes: Any
) -> None:
    nodes = start_cluster(cluster_data, start_nodes)
    ranks = [replace(rank, exchange=0.1) for rank in ranks_on(cluster_data, nodes, PER_NODE, "node")]
    ratios: list[float] = []
    once = exactly_once(cluster_data)

    def check(epoch: int, keys: dict[int, list[str]]) -> None:
        once(epoch, keys)
        ratios.append(egress(nodes) / cluster_data.total_bytes)

    run_cluster(rank_processes, ranks, EPOCHS, check)
    print(f"cluster S3 egress, exchange=0.1, after each epoch: {[round(r, 3) for r in ratios]}x the dataset")
    # Each later epoch moves another ~10% of the units (48 shards: a few) to other nodes for one epoch.
    assert 1.05 <= ratios[-1] <= 1.5


def progress(rank: int) -> int:
    """How far rank `rank` got before the checkpoint: not started, mid-shard, several shards, or done."""
    return [0, 13, 40, 9, 1000, 25, 57, 31][rank % 8]


def elastic_resume(
    data: ClusterData, nodes: list[Node], old_nodes: int, new_nodes: int, context: Any
) -> tuple[list[str], list[str]]:
    old = ranks_on(data, nodes[:old_nodes], PER_NODE)
    new = ranks_on(data, nodes[:new_nodes], PER_NODE)
    with ProcessPoolExecutor(max(len(old), len(new)), mp_context=context) as pool:
        parts = list(pool.map(read_part, old, [progress(r.rank) for r in old], timeout=DEADLINE_S))
        merged = merge_states([state for _, state in parts])
        rest = list(pool.map(read_rest, new, [merged] * len(new), timeout=DEADLINE_S))
    return [k for keys, _ in parts for k in keys], [k for keys in rest for k in keys]


@pytest.fixture(scope="module")
def elastic_nodes(
    cluster_data: ClusterData, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Node]]:
    """One set of 4 daemons for the elastic resumes (they check what is read, not what is downloaded)."""
    nodes = NodeSet(tmp_path_factory.mktemp("elastic-nodes"))
    yield start_cluster(cluster_data, nodes.start)
    nodes.stop()


@pytest.mark.parametrize(("old_nodes", "new_nodes"), [(4, 3), (2, 4)], ids=["4->3 nodes", "2->4 nodes"])
def test_elastic_resume_on_real_daemons_loses_and_repeats_nothing(
    cluster_data: ClusterData, elastic_nodes: list[Node], rank_processes: Any, old_nodes: int, new_nodes: int
) -> None:
    before = egress(elastic_nodes)
    seen, rest = elastic_resume(cluster_data, elastic_nodes, old_nodes, new_nodes, rank_processes)
    assert 0 < len(seen) < sum(cluster_data.keys.values())
    lost = cluster_data.keys - Counter(seen) - Counter(rest)
    twice = Counter(seen) + Counter(rest) - cluster_data.keys
    assert (sum(lost.values()), sum(twice.values())) == (0, 0)
    print(
        f"elastic resume {old_nodes}->{new_nodes} nodes: {len(seen)} samples before, {len(rest)} after; "
        f"S3 egress {(egress(elastic_nodes) - before) / cluster_data.total_bytes:.3f}x the dataset"
    )
