"""Sample counts for equal work per rank, and the run facts every reader of a dataset must agree on.

`even="drop"|"pad"` cuts the data at sample granularity, so every reader needs every unit's sample count.
Manifests (`num_samples`, written by `shardcache manifest`) and parquet footers give them for free. For tar
and jsonl shards without counts the design is a counting pass, not a runtime agreement between ranks: the
cut must be known before the first sample so that every rank (and every DataLoader worker, which cannot
join collectives) computes the same plan from the same numbers.

The pass runs once per dataset in the trainer's main process (`Dataset.__iter__`, `TorchLoader.__iter__`;
its results travel to DataLoader workers with the pickled dataset). With torch.distributed initialised each
rank counts a share of its own node's units, through its node's daemon, so the shards land in the cache
that will serve them, and the counts are exchanged with `all_gather_object`: the cluster reads each shard
once, ahead of the first epoch. Without torch.distributed one process counts every shard. Counting reads
shards whole: for large datasets write a manifest instead (the log line says so).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardcache.context import RuntimeContext, in_main_process, torch_distributed
from shardcache.memo import IdentityMemo
from shardcache.shards import ShardRef
from shardcache.sources.deal.partition import PLACEMENT_SEED, Partitioning, ShardUnits, Unit, owners
from shardcache.topology.hosts import GroupLayout, known_layout
from shardcache.topology.launchers import NodeLayout

logger = logging.getLogger(__name__)


@dataclass
class RunFacts:
    """What the trainer's main process learned for a dataset: travels to its DataLoader workers.

    Attributes:
        counts: Samples per unit key (see `unit_key`), from the counting pass.
        offsets: Sample offsets per unit key, recorded by the counting pass where the kind can (tars).
        is_distributed: Whether torch.distributed ran several processes when the main process last looked
            (None: not captured yet). Facts about the world are read when the world exists: live wherever
            torch.distributed is initialised in the process (the trainer, a forked worker), and captured
            again whenever the main process iterates or sends the dataset to a spawned worker, so a count
            taken before `init_process_group` does not freeze the job as "not distributed".
    """

    counts: dict[str, int] = field(default_factory=dict)
    is_distributed: bool | None = None
    offsets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # (rank, world_size) of torch.distributed in the main process when captured: what a spawned worker,
    # which has no process group, reads as its rank (launchers such as Lightning's set no RANK variable).
    world: tuple[int, int] | None = None
    # The node layout the main process learned from its process group's hosts when captured (None: none
    # exchanged): a spawned worker cannot ask the group, and its launcher variables may not tell.
    layout: GroupLayout | None = None

    def distributed(self) -> bool:
        dist = torch_distributed()
        if dist is not None:  # the live world wins over any capture
            return int(dist.get_world_size()) > 1
        return bool(self.is_distributed)

    def capture(self) -> None:
        """Record the main process's view of torch.distributed (workers started without it inherit it)."""
        if in_main_process():
            dist = torch_distributed()
            self.is_distributed = dist is not None and int(dist.get_world_size()) > 1
            self.world = None if dist is None else (int(dist.get_rank()), int(dist.get_world_size()))
            self.layout = None if dist is None else known_layout(dist)

    def worker_environment(self) -> Mapping[str, str] | None:
        """The environment a reader infers its rank from: in a worker without a process group (spawned),
        the launcher's variables with the main process's rank and world size, and the node layout its
        process group's hosts gave, in torchrun's names (the closest launcher's); else None (`os.environ`)."""
        if self.world is None or in_main_process() or torch_distributed() is not None:
            return None
        rank, world_size = self.world
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size)}
        if self.layout is not None:
            # None: the group counted as one node (its warning said why); the worker does the same, quietly.
            layout = self.layout.layout or NodeLayout(world_size, 1, rank, 0)
            local_rank = rank % layout.local_world_size if layout.local_rank is None else layout.local_rank
            node_rank = rank // layout.local_world_size if layout.node_rank is None else layout.node_rank
            env.update(
                LOCAL_WORLD_SIZE=str(layout.local_world_size),
                GROUP_WORLD_SIZE=str(layout.num_nodes),
                LOCAL_RANK=str(local_rank),
                GROUP_RANK=str(node_rank),
            )
        return env

    def __getstate__(self) -> dict[str, Any]:
        # Pickled by the trainer for a spawned worker (or any copy): the world as it is now.
        self.capture()
        return dict(self.__dict__)


class Countable(Protocol):
    """What counting needs of a source node (`shardcache.sources.base.SourceNode` is one)."""

    @property
    def facts(self) -> RunFacts: ...

    @property
    def ctx(self) -> RuntimeContext: ...

    @property
    def partitioning(self) -> Partitioning: ...

    def weights(self, units: Sequence[Unit]) -> tuple[float, ...]: ...

    def count(self, unit: Unit) -> int: ...


# What one rank counted in the counting pass: unit key -> (samples, sample offsets or None).
Counted = dict[str, tuple[int, tuple[int, ...] | None]]


def unit_key(unit: Unit) -> str:
    return unit.ref.url if unit.part == 0 else f"{unit.ref.url}#{unit.part}"


def unit_counts(node: Countable, units: Sequence[Unit]) -> list[int]:
    """Every unit's sample count: from metadata, from earlier counting (`known_counts`), else by counting
    now."""
    known = known_counts(node, units)
    if known is not None:
        return known
    counts = node.facts.counts
    missing = [i for i, u in enumerate(units) if u.count is None and unit_key(u) not in counts]
    _count(node, units, missing)
    return [u.count if u.count is not None else counts[unit_key(u)] for u in units]


def known_counts(node: Countable, units: Sequence[Unit]) -> list[int] | None:
    """Every unit's sample count where it is known without reading a shard (metadata, or an earlier
    counting pass), else None. Whole shards whose metadata gives every count are read once per process and
    shard list (no unit objects made)."""
    if isinstance(units, ShardUnits):
        shards = units.shards
        known = _KNOWN.get(shards, "counts", lambda: _known_counts(shards))
        if known is not None:
            return known
    counts = node.facts.counts
    found: list[int] = []
    for unit in units:
        count = unit.count if unit.count is not None else counts.get(unit_key(unit))
        if count is None:
            return None
        found.append(count)
    return found


_KNOWN: IdentityMemo[list[int] | None] = IdentityMemo()


def _known_counts(shards: Sequence[ShardRef]) -> list[int] | None:
    """Every shard's sample count from its metadata, or None when one is unknown (then counted)."""
    counts = [ref.num_samples for ref in shards]
    return None if any(c is None for c in counts) else [c for c in counts if c is not None]


def _count(node: Countable, units: Sequence[Unit], missing: list[int]) -> None:
    ctx = node.ctx
    dist = torch_distributed() if in_main_process() else None
    # The collective only where the reader's context is the process group's (not a job of one process,
    # as under Accelerate's own split: the other ranks would never join).
    if dist is not None and int(dist.get_world_size()) > 1 and ctx.world_size == int(dist.get_world_size()):
        mine = missing
        if node.partitioning.placement == "node" and ctx.node_groups > 1:
            owner = owners(node.weights(units), ctx.node_groups, PLACEMENT_SEED)
            mine = [i for i in missing if owner[i] == ctx.node_group]
        ranks_in_group = ctx.dp_size // ctx.node_groups
        local = ctx.dp_rank % ranks_in_group
        share = mine[local::ranks_in_group]
        logger.info(
            "counting the samples of %d of %d shards on this rank for even=%r (a manifest with num_samples, "
            "written by `shardcache manifest`, skips this pass)",
            len(share),
            len(missing),
            node.partitioning.even,
        )
        found: Counted = {}
        for i in share:
            key = unit_key(units[i])
            found[key] = (node.count(units[i]), node.facts.offsets.get(key))
        gathered: list[Counted | None] = [None] * int(dist.get_world_size())
        dist.all_gather_object(gathered, found)
        for part in gathered:
            for key, (count, offsets) in (part or {}).items():
                node.facts.counts[key] = count
                if offsets:
                    node.facts.offsets[key] = offsets
        lost = [i for i in missing if unit_key(units[i]) not in node.facts.counts]
        missing = lost  # units no rank counted (another rank's node group was empty): count them here
        if not missing:
            return
    if not in_main_process():
        logger.warning(
            "counting the samples of %d shards inside a DataLoader worker for even=%r: iterate through "
            "TorchLoader (it counts once in the main process) or give a manifest with num_samples",
            len(missing),
            node.partitioning.even,
        )
    else:
        logger.info(
            "counting the samples of %d shards for even=%r (a manifest with num_samples, written by "
            "`shardcache manifest`, skips this pass)",
            len(missing),
            node.partitioning.even,
        )
    for i in missing:
        node.facts.counts[unit_key(units[i])] = node.count(units[i])
