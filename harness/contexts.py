"""Explicit RuntimeContexts of a simulated cluster: every slot (rank x DataLoader worker) of its nodes."""

from __future__ import annotations

from shardcache import RuntimeContext


def contexts(
    nodes: int, per_node: int, workers: int = 1, epoch: int = 0, one_node: bool = False
) -> list[RuntimeContext]:
    """Every slot of `nodes` x `per_node` ranks x `workers` (one_node: the same ranks on a single node)."""
    world = nodes * per_node
    return [
        RuntimeContext(
            rank=r,
            world_size=world,
            worker_id=w,
            num_workers=workers,
            epoch=epoch,
            local_world_size=world if one_node else per_node,
        )
        for r in range(world)
        for w in range(workers)
    ]
