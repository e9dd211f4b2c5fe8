"""The cluster simulation (bench/bench_cluster.py) drives the daemon's planner faithfully.

With equal-sized shards and node placement, each node's simulated cache fetches exactly as often as the
offline simulators of harness/belady_sim.py on the same round-robin trace: Belady as the MIN that knows what
the plans tell (current and next epoch), LRU as plain LRU.
"""

from __future__ import annotations

import pytest

from bench import bench_cluster as cluster_sim
from harness import belady_sim
from shardcache.sources.deal.partition import Partitioning


def _trace(orders: list[list[list[tuple[int, int]]]]) -> list[belady_sim.Access]:
    trace: list[belady_sim.Access] = []
    for epoch, per_slot in enumerate(orders[:-1]):  # the last epoch is only announced
        for _, slot, unit in cluster_sim.node_trace(per_slot):
            trace.append(belady_sim.Access(slot, epoch, f"s3://bucket/{unit:07d}.tar"))
    return trace


@pytest.mark.parametrize("capacity", [3, 6, 9, 12])
def test_node_caches_fetch_as_often_as_the_offline_simulators(capacity: int) -> None:
    cluster = cluster_sim.Cluster(nodes=4, ranks=2, workers=2, units_per_node=12)
    counts = [100] * cluster.nodes * cluster.units_per_node  # equal shards: fetches count bytes
    plans = cluster_sim.epoch_plans(cluster, counts, Partitioning("node"), 4)
    sizes = [1] * len(counts)
    for node in range(cluster.nodes):
        orders = cluster_sim.node_orders(plans, cluster, node)
        trace = _trace(orders)
        belady = cluster_sim.node_fetched(orders, sizes, capacity, "belady")
        lru = cluster_sim.node_fetched(orders, sizes, capacity, "lru")
        assert belady == belady_sim.min_fetches(trace, capacity, lookahead_epochs=1)
        assert lru == belady_sim.lru_fetches(trace, capacity)


def test_node_placement_with_room_for_a_share_downloads_the_dataset_once() -> None:
    cluster = cluster_sim.Cluster(nodes=4, ranks=2, workers=2, units_per_node=12)
    parts = {"node": Partitioning("node")}
    rows = cluster_sim.egress_grid(cluster, 4, [1.2], ["belady", "lru"], parts, None)
    assert [row.egress for row in rows] == [pytest.approx(1.0), pytest.approx(1.0)]
