"""Cluster scale, simulated: S3 egress over epochs and shuffle quality of global, node and exchange placement.

No servers: the reading orders come from the client's own partitioning code
(`sources.deal.partition.plan_epoch` with the real `Layout` and `Partitioning`), and every node's cache
decisions from the daemon's own planner (`shardcached.planning.planner.Planner`, policy "belady" or its "lru"
baseline), one planner and one simulated cache per node, so any number of nodes fits on one machine.

Per node: `ranks` data-parallel ranks x `workers` DataLoader workers = slots. When an epoch starts, every slot
registers its plans for that epoch and the next one and deletes the finished one (the client's PlanTracker);
then the node's slots read one sample per clock tick each, all at the same pace, so their opens interleave
round-robin by sample position: a slot opens a shard when it has read the samples before it (slots opening
at the same tick go in slot order; consecutive pieces of one shard are one open, as in the client's plans).
Every epoch ends before the next starts (DDP steps in lockstep). A miss fetches the whole shard and evicts
what the planner chooses until it fits (demand opens only: no prefetch, which only moves fetches earlier).
The cache holds `capacity` x a node's share of the dataset in bytes. Egress is the bytes all nodes fetched
over all epochs, divided by the dataset's size.

Shuffle quality (one seed, the same layout) compares placements on what an ML engineer can check:
  stratum CV: how evenly one global batch (one step of every rank) draws from the canonical node partitions
      (the coefficient of variation of the samples each partition contributes; 0 = exactly proportional);
  units/batch: distinct shards that contribute to one global batch (the within-shard correlation a batch
      carries; the same for every placement, as each worker reads a shard sequentially);
  spearman: rank correlation of a sample's position between consecutive epochs (0 = fresh order);
  seen/node: the share of the dataset a node's ranks read over all epochs (what unsynchronised per-rank
      state such as BatchNorm statistics ever sees).

    .venv/bin/python -m bench.bench_cluster            # the figures in docs/benchmarks.md (a few minutes)
    .venv/bin/python -m bench.bench_cluster --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardcache.sources.deal.partition import (
    Layout,
    Partitioning,
    Piece,
    node_members,
    owners,
    plan_epoch,
    weights_of,
)
from shardcached.planning import Planner

SAMPLE_BYTES = 10_000  # bytes per sample: shards of ~1 MB; only ratios are reported


@dataclass(frozen=True)
class Cluster:
    """A simulated job: nodes x ranks per node x workers per rank, and the dataset's shards."""

    nodes: int
    ranks: int  # per node
    workers: int
    units_per_node: int
    seed: int = 0

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, self.nodes * self.ranks, self.workers)

    @property
    def slots_per_node(self) -> int:
        return self.ranks * self.workers

    def dataset(self) -> tuple[list[int], list[int]]:
        """(samples, bytes) of every shard: 90-110 samples each, bytes in proportion."""
        rng = random.Random(f"bench-cluster:{self.seed}")
        counts = [rng.randint(90, 110) for _ in range(self.nodes * self.units_per_node)]
        return counts, [c * SAMPLE_BYTES for c in counts]


def placements(even: str | None, exchange: float) -> dict[str, Partitioning]:
    return {
        "global": Partitioning("global", even),
        "node": Partitioning("node", even),
        f"node+x{exchange:g}": Partitioning("node", even, exchange),
    }


def epoch_plans(
    cluster: Cluster, counts: Sequence[int], partitioning: Partitioning, epochs: int
) -> list[list[list[Piece]]]:
    """plans[epoch][slot]: every slot's pieces, straight from the client's partitioning code."""
    universe = [Piece(u, 0, c) for u, c in enumerate(counts)]
    weights = weights_of(list(counts), [c * SAMPLE_BYTES for c in counts])
    return [
        plan_epoch(universe, weights, cluster.layout, partitioning, cluster.seed, epoch)
        for epoch in range(epochs)
    ]


Orders = list[list[list[tuple[int, int]]]]  # [epoch][local slot] -> (shard, samples read from it) per open


def node_orders(plans: list[list[list[Piece]]], cluster: Cluster, node: int) -> Orders:
    """What a node's slots open in every epoch: consecutive pieces of one shard are one open."""
    first = node * cluster.slots_per_node  # slots are group-major: a node's ranks are contiguous
    out = []
    for per_slot in plans:
        epoch = []
        for pieces in per_slot[first : first + cluster.slots_per_node]:
            opens: list[tuple[int, int]] = []
            for piece in pieces:
                if opens and opens[-1][0] == piece.unit:
                    opens[-1] = (piece.unit, opens[-1][1] + piece.size)
                else:
                    opens.append((piece.unit, piece.size))
            epoch.append(opens)
        out.append(epoch)
    return out


def node_trace(per_slot: list[list[tuple[int, int]]]) -> list[tuple[float, int, int]]:
    """One epoch's opens of a node as (time, slot, shard), in time order.

    Every slot reads one sample per tick, so a slot opens a shard once it has read the samples before it in
    the epoch, at phase slot / slots within the tick: slots that reach a shard in the same tick open it in
    slot order (round-robin by sample position), and no two opens share a time.
    """
    events = []
    for slot, opens in enumerate(per_slot):
        clock = slot / len(per_slot)
        for unit, samples in opens:
            events.append((clock, slot, unit))
            clock += samples
    events.sort()
    return events


def node_fetched(orders: Orders, sizes: Sequence[int], capacity: int, policy: str) -> int:
    """Bytes one node's cache fetches over the epochs (the last epoch is only announced, never read)."""
    tick = [0.0]
    planner = Planner(policy=policy, prefetch_depth=0, stale_after_s=1e18, clock=lambda: tick[0])
    urls = {u: f"s3://bucket/{u:07d}.tar" for epoch in orders for slot in epoch for u, _ in slot}
    size_of = {url: sizes[u] for u, url in urls.items()}
    plan_ids: dict[tuple[int, int], str] = {}
    resident: dict[str, None] = {}
    used = fetched = 0
    start = 0.0
    for epoch in range(len(orders) - 1):
        for slot in range(len(orders[epoch])):  # PlanTracker.start: this epoch and the next, drop the last
            for e in (epoch, epoch + 1):
                if (slot, e) not in plan_ids:
                    plan_ids[slot, e] = planner.add_plan(
                        "job", slot, e, [urls[u] for u, _ in orders[e][slot]]
                    )
            old = plan_ids.pop((slot, epoch - 1), None)
            if old is not None:
                planner.delete_plan(old)
        for clock, slot, unit in node_trace(orders[epoch]):
            tick[0] = start + clock
            url = urls[unit]
            planner.record_open(url, plan_ids[slot, epoch])
            if url in resident:
                continue
            size = size_of[url]
            fetched += size
            while resident and used + size > capacity:
                victim = planner.choose_victim(list(resident), None)
                assert victim is not None
                del resident[victim]
                planner.forget(victim)
                used -= size_of[victim]
            resident[url] = None
            used += size
        start += max((sum(n for _, n in opens) for opens in orders[epoch]), default=0) + 1
    return fetched


@dataclass
class EgressRow:
    nodes: int
    placement: str
    capacity: float
    policy: str
    egress: float  # x the dataset
    simulated_nodes: int


def egress_grid(
    cluster: Cluster,
    epochs: int,
    capacities: Sequence[float],
    policies: Sequence[str],
    parts: dict[str, Partitioning],
    sample_nodes: int | None,
) -> list[EgressRow]:
    """Egress for every placement x capacity x policy; with `sample_nodes`, that many evenly spaced nodes
    are simulated and the total scaled up (the nodes' caches are independent, so this only adds noise)."""
    counts, sizes = cluster.dataset()
    total = sum(sizes)
    share = total / cluster.nodes
    simulated = list(range(cluster.nodes))
    if sample_nodes and sample_nodes < cluster.nodes:
        simulated = [i * cluster.nodes // sample_nodes for i in range(sample_nodes)]
    rows = []
    for name, partitioning in parts.items():
        plans = epoch_plans(cluster, counts, partitioning, epochs + 1)
        orders = [node_orders(plans, cluster, node) for node in simulated]
        del plans
        for capacity in capacities:
            for policy in policies:
                fetched = sum(node_fetched(o, sizes, int(capacity * share), policy) for o in orders)
                egress = fetched * cluster.nodes / len(simulated) / total
                rows.append(EgressRow(cluster.nodes, name, capacity, policy, egress, len(simulated)))
                print(
                    f"{cluster.nodes:>6}{name:>12}{capacity:>6.1f}x{policy:>8}{egress:>10.2f}x"
                    f"{len(simulated):>8}",
                    flush=True,
                )
    return rows


def reused_share(cluster: Cluster, partitioning: Partitioning) -> float:
    """Share of the shards the nodes read in epoch 2 that the same node had read in epoch 1 (by count)."""
    counts, _ = cluster.dataset()
    plans = epoch_plans(cluster, counts, partitioning, 2)
    orders = [node_orders(plans, cluster, node) for node in range(cluster.nodes)]
    reused = total = 0
    for per_epoch in orders:
        before = {u for slot in per_epoch[0] for u, _ in slot}
        now = {u for slot in per_epoch[1] for u, _ in slot}
        reused += len(now & before)
        total += len(now)
    return reused / total


def moved(weights: tuple[float, ...], before: int, after: int, seed: int) -> float:
    """Share of the weight whose node group differs between `before` and `after` node groups."""
    old, new = owners(weights, before, seed), owners(weights, after, seed)
    return sum(w for w, a, b in zip(weights, old, new, strict=True) if a != b) / sum(weights)


@dataclass
class ShuffleRow:
    placement: str
    stratum_cv: float
    units_per_batch: float
    spearman: float
    seen_per_node: float


def sample_positions(
    plans: list[list[Piece]], cluster: Cluster, offsets: np.ndarray, batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample ids, global step, unit) in reading order of one epoch, per rank batch of `batch` samples.

    A rank's DataLoader takes worker batches round-robin: worker w's b-th batch is the rank's step
    b * workers + w; a global batch is one step of every rank.
    """
    ids, steps, units = [], [], []
    workers = cluster.workers
    for slot, pieces in enumerate(plans):
        worker = slot % workers
        stream = (
            np.concatenate(
                [np.arange(offsets[p.unit] + p.start, offsets[p.unit] + (p.stop or 0)) for p in pieces]
            )
            if pieces
            else np.zeros(0, dtype=np.int64)
        )
        unit_of = (
            np.concatenate([np.full((p.stop or 0) - p.start, p.unit) for p in pieces])
            if pieces
            else np.zeros(0, dtype=np.int64)
        )
        ids.append(stream)
        steps.append((np.arange(len(stream)) // batch) * workers + worker)
        units.append(unit_of)
    return np.concatenate(ids), np.concatenate(steps), np.concatenate(units)


def shuffle_quality(
    cluster: Cluster, parts: dict[str, Partitioning], epochs: int, batch: int
) -> list[ShuffleRow]:
    counts, sizes = cluster.dataset()
    offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    weights = weights_of(counts, sizes)
    stratum_of_unit = np.zeros(len(counts), dtype=np.int64)
    for g, members in enumerate(node_members(weights, cluster.nodes, cluster.seed)):
        stratum_of_unit[list(members)] = g
    slot_node = np.repeat(np.arange(cluster.nodes), cluster.slots_per_node)
    rows = []
    for name, partitioning in parts.items():
        plans = epoch_plans(cluster, counts, partitioning, epochs)
        cvs, per_batch, rhos = [], [], []
        seen = np.zeros((cluster.nodes, n), dtype=bool)
        previous: np.ndarray | None = None
        for per_slot in plans:
            ids, steps, units = sample_positions(per_slot, cluster, offsets, batch)
            lengths = [sum((p.stop or 0) - p.start for p in pieces) for pieces in per_slot]
            seen[np.repeat(slot_node, lengths), ids] = True
            # Global batches that every rank fills completely (the tail of an uneven epoch is left out).
            step_count = int(steps.max()) + 1
            by_step = np.zeros((step_count, cluster.nodes))
            np.add.at(by_step, (steps, stratum_of_unit[units]), 1)
            complete = by_step.sum(axis=1) == cluster.nodes * cluster.ranks * batch
            full = by_step[complete]
            cvs.append(float(np.mean(full.std(axis=1) / full.mean(axis=1))))
            pairs = np.unique(steps * len(counts) + units)
            per_batch.append(float(np.bincount(pairs // len(counts), minlength=step_count)[complete].mean()))
            position = np.full(n, -1, dtype=np.int64)
            position[ids] = steps  # a sample's global step; samples of one step tie
            if previous is not None:
                both = (position >= 0) & (previous >= 0)
                rhos.append(spearman(previous[both], position[both]))
            previous = position
        rows.append(
            ShuffleRow(
                name,
                float(np.mean(cvs)),
                float(np.mean(per_batch)),
                float(np.mean(rhos)),
                float(seen.sum(axis=1).mean() / n),
            )
        )
    return rows


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])


def average_ranks(values: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (starts + (counts - 1) / 2)[inverse]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to quote")
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 1024])
    parser.add_argument("--ranks", type=int, default=8, help="data-parallel ranks per node")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank")
    parser.add_argument("--units-per-node", type=int, default=128, help="shards per node's share")
    parser.add_argument("--large", type=int, default=1024, help="node counts from here use the reductions")
    parser.add_argument("--large-units-per-node", type=int, default=64)
    parser.add_argument("--large-sample-nodes", type=int, default=128, help="nodes simulated at that scale")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--capacity", type=float, nargs="+", default=[0.5, 1.0, 1.5])
    parser.add_argument("--policies", nargs="+", default=["belady", "lru"], choices=["belady", "lru"])
    parser.add_argument("--even", default="none", choices=["none", "drop", "pad"])
    parser.add_argument("--exchange", type=float, default=0.1)
    parser.add_argument("--headroom", type=float, nargs="+", default=[1.0, 1.02, 1.1, 1.2])
    parser.add_argument("--shuffle-nodes", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step (shuffle quality)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.units_per_node, args.epochs, args.shuffle_nodes = [4, 16], 16, 3, 8
        args.ranks, args.workers = 2, 2
    even = None if args.even == "none" else args.even
    parts = placements(even, args.exchange)
    started = time.monotonic()

    layout = f"{args.ranks} ranks x {args.workers} workers per node"
    print(f"reuse: share of a node's epoch-2 shards it read in epoch 1 ({layout}, 4,096 shards)")
    reuse_nodes = [1, 4, 16, 64] if not args.quick else [1, 4]
    print(f"{'placement':>12}" + "".join(f"{n:>8}" for n in reuse_nodes))
    for name, partitioning in parts.items():
        shares = [
            reused_share(Cluster(n, args.ranks, args.workers, 4096 // n, args.seed), partitioning)
            for n in reuse_nodes
        ]
        print(f"{name:>12}" + "".join(f"{s:>8.1%}" for s in shares), flush=True)

    print(f"\negress over {args.epochs} epochs / dataset (even={even}, {layout})")
    print(f"{'nodes':>6}{'placement':>12}{'cap':>7}{'policy':>8}{'egress':>11}{'sim':>8}")
    for nodes in args.nodes:
        large = nodes >= args.large
        cluster = Cluster(
            nodes,
            args.ranks,
            args.workers,
            args.large_units_per_node if large else args.units_per_node,
            args.seed,
        )
        egress_grid(
            cluster,
            args.epochs,
            args.capacity,
            args.policies,
            parts,
            args.large_sample_nodes if large else None,
        )

    cluster = Cluster(args.shuffle_nodes, args.ranks, args.workers, args.units_per_node, args.seed)
    print(f"\nheadroom: node placement, {cluster.nodes} nodes, {args.epochs} epochs, egress / dataset")
    print(f"{'even':>6}{'exchange':>9}{'cap':>7}{'belady':>9}{'lru':>8}")
    counts, sizes = cluster.dataset()
    share = sum(sizes) / cluster.nodes
    for mode, exchange in ((None, 0.0), ("drop", 0.0), ("pad", 0.0), (None, args.exchange)):
        plans = epoch_plans(cluster, counts, Partitioning("node", mode, exchange), args.epochs + 1)
        orders = [node_orders(plans, cluster, node) for node in range(cluster.nodes)]
        for capacity in args.headroom:
            egress = [
                sum(node_fetched(o, sizes, int(capacity * share), policy) for o in orders) / sum(sizes)
                for policy in ("belady", "lru")
            ]
            print(
                f"{mode or 'none':>6}{exchange:>9g}{capacity:>6.2f}x{egress[0]:>8.3f}x{egress[1]:>7.3f}x",
                flush=True,
            )

    print("\nresize: share of the data whose node group changes (by samples), against 1/(N+1)")
    print(f"{'N':>6}{'N->N+1':>9}{'1/(N+1)':>9}{'N->N-1':>9}{'1/N':>8}{'N->2N':>8}")
    for n in (4, 16, 64) if not args.quick else (4,):
        counts, sizes = Cluster(n, args.ranks, args.workers, args.units_per_node, args.seed).dataset()
        weights = weights_of(counts, sizes)
        print(
            f"{n:>6}{moved(weights, n, n + 1, args.seed):>9.2%}{1 / (n + 1):>9.2%}"
            f"{moved(weights, n, n - 1, args.seed):>9.2%}{1 / n:>8.2%}"
            f"{moved(weights, n, 2 * n, args.seed):>8.2%}",
            flush=True,
        )

    print(
        f"\nshuffle quality: {cluster.nodes} nodes, {args.epochs} epochs, batch {args.batch} per rank "
        f"({cluster.nodes * args.ranks * args.batch} per global batch)"
    )
    print(f"{'placement':>12}{'stratum CV':>12}{'units/batch':>13}{'spearman':>10}{'seen/node':>11}")
    for row in shuffle_quality(cluster, parts, args.epochs, args.batch):
        print(
            f"{row.placement:>12}{row.stratum_cv:>12.3f}{row.units_per_batch:>13.1f}{row.spearman:>10.4f}"
            f"{row.seen_per_node:>11.2%}",
            flush=True,
        )
    print(f"\n{time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
