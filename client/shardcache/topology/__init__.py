"""Which ranks share a node, whoever launched the job: what `RuntimeContext.from_runtime` reads.

Node placement gives each node a fixed share of the data so its daemon's cache keeps serving it; it needs
to know how many ranks run on each node. The rule, in order:

1. **Rank and world** come from the process group when there is one, else from the closest launcher that
   names them (`RANK`/`WORLD_SIZE`, then Open MPI's, then Slurm's; `shardcache.topology.launchers`).
2. **The layout** comes from the closest launcher whose variables describe this very rank and world and
   give the ranks per node: torchrun's `LOCAL_WORLD_SIZE`, Open MPI's local size (without a process group
   only: it cannot show uneven nodes), Slurm's tasks per node. The launcher that spawned the processes
   knows how it grouped them, and reading its variables needs no communication.
3. Else, in the trainer's process with a process group, **the ranks' hosts** exchanged once through the
   group's store (`shardcache.topology.hosts`): what Lightning's own launcher, `mp.spawn` or a hand-made
   launcher need.
4. Else the job counts as **one node**, and says so in one warning per process naming what to set.

A layout that does not fit node placement (ranks spread unevenly over the nodes) counts as one node too,
with a warning naming the counts. Ranks numbered across nodes (`block_problem`) keep their layout, with a
warning: node placement still deals the data consistently, but each node's share is read on other nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import ModuleType

from shardcache.topology.hosts import GroupLayout, group_layout, known_layout
from shardcache.topology.launchers import SET_LOCAL_WORLD_SIZE, NodeLayout, launches

__all__ = ["NodeLayout", "Warnings", "node_layout", "rank_and_world"]

logger = logging.getLogger(__name__)


class Warnings:
    """Which layout warnings this process has logged: each once per process (a job's every pass resolves
    its context again, and a forked DataLoader worker inherits what its parent said)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def warn(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            logger.warning("%s", message)


WARNINGS = Warnings()


def rank_and_world(env: Mapping[str, str]) -> tuple[int, int]:
    """Rank and world size from the closest launcher that names both; else rank 0 of the closest world
    size given (Lightning's WORLD_SIZE: its process group has the rank); else 0 of 1."""
    found = launches(env)
    for launch in found:
        if launch.rank is not None and launch.world_size is not None:
            return launch.rank, launch.world_size
    return 0, next((launch.world_size for launch in found if launch.world_size is not None), 1)


def node_layout(
    env: Mapping[str, str],
    rank: int,
    world_size: int,
    dist: ModuleType | None,
    *,
    owns_group: bool,
    warnings: Warnings | None = None,
) -> NodeLayout | None:
    """The node layout of `rank` in `world_size` (None: one node), by the rule of the module.

    Args:
        env: The launcher's environment.
        rank: This process's rank (the process group's when there is one).
        world_size: The job's ranks.
        dist: `torch.distributed` when a process group is initialised here (also in a forked worker).
        owns_group: Whether this process may talk to the group's store (the trainer's process, not a
            DataLoader worker that inherited the group).
        warnings: What this process has warned about already (default: the process's own record).
    """
    said = WARNINGS if warnings is None else warnings
    if world_size == 1:
        return None
    found = launches(env)
    partial: NodeLayout | None = None  # a layout only this node's count gave (Open MPI's)
    for launch in found:
        if not launch.describes(rank, world_size):
            continue  # an outer launcher's, or one the process group overrides
        if launch.problem is not None:
            return _one_node(said, launch.problem, world_size)
        if launch.layout is not None:
            if launch.whole or dist is None:
                return _checked(said, launch.layout, rank)
            partial = partial or launch.layout
    if dist is not None:
        outcome: GroupLayout | None = group_layout(dist) if owns_group else known_layout(dist)
        if outcome is not None:
            if outcome.layout is None:
                return _one_node(said, outcome.problem or "", world_size)
            return _checked(said, outcome.layout, rank)
    if partial is not None:  # a worker whose trainer never exchanged hosts: the launcher's word
        return _checked(said, partial, rank)
    hint = next((launch.hint for launch in found if launch.hint), SET_LOCAL_WORLD_SIZE)
    seen = ", ".join(sorted({launch.name for launch in found})) or "no launcher variables"
    if dist is None:
        hint += (
            ", or iterate once torch.distributed is initialised (under Lightning, once Trainer.fit has "
            "started): the hosts of its ranks then tell"
        )
    return _one_node(said, f"cannot tell which ranks share a node ({seen}): {hint}", world_size)


def _one_node(said: Warnings, reason: str, world_size: int) -> NodeLayout | None:
    """No layout (one node), after saying why, once per process."""
    said.warn(
        f"shardcache counts this job of {world_size} ranks as one node, so node placement cannot give each "
        f"node a share of its own (placement='auto' reads 'global': every node's daemon fetches shards of "
        f"the whole dataset each epoch): {reason}"
    )
    return None


def _checked(said: Warnings, layout: NodeLayout, rank: int) -> NodeLayout:
    # Only the ranks whose number is off see it (the others cannot tell): the layout stays, the same on
    # every rank, so the data is still dealt consistently, if with less reuse; the warning says how to fix it.
    problem = block_problem(layout, rank)
    if problem is not None:
        said.warn(f"shardcache's node placement will reuse little of each node's cache: {problem}")
    return layout


def block_problem(layout: NodeLayout, rank: int) -> str | None:
    """Why a layout that numbers ranks across nodes (rank != node_rank x local_world_size + local_rank, as
    `srun -m cyclic` or `mpirun --map-by node` do) cannot serve node placement, which deals a node's share
    to consecutive ranks; None when it numbers them node by node (or does not say where this rank is)."""
    if layout.local_rank is None or layout.node_rank is None:
        return None
    if rank == layout.node_rank * layout.local_world_size + layout.local_rank:
        return None
    return (
        f"{layout.source} numbers the ranks across nodes (rank {rank} is local rank {layout.local_rank} on "
        f"node {layout.node_rank} of {layout.local_world_size} ranks each), while node placement gives each "
        "node's share to consecutive ranks: launch with block distribution (srun -m block, mpirun --map-by "
        "slot)"
    )
