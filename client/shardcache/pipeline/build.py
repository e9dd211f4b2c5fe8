"""`build(spec, ctx)`: one slot's node chain of a pipeline — the root's node, then one node per stage.

A `.cache()` boundary is resolved first (`shardcache.snapshots.boundary.cut_at_cache`: materialised once,
then read back as a Lance source), so only the stages after it run on every pass. A composed root (a mix)
builds its own node, and builds its members with this same function.

With a `StageClock` (`shardcache.pipeline.stage_times`), the root's node and every stage's node are timed:
the root as `read` (for a mix, its members' stages included), each stage by its kind and position.
"""

from __future__ import annotations

from shardcache.context import RuntimeContext
from shardcache.node import Node
from shardcache.pipeline.stage_times import READ, StageClock, timed_stages
from shardcache.snapshots.boundary import cut_at_cache
from shardcache.spec import ComposedSource, PipelineSpec


def build(spec: PipelineSpec, ctx: RuntimeContext, clock: StageClock | None = None) -> Node:
    """The node chain of `spec` for the slot `ctx` names; timed into `clock` when given."""
    spec = cut_at_cache(spec, ctx, build)
    node: Node
    if isinstance(spec.source, ComposedSource):
        node = spec.source.node(ctx)
    else:
        node = spec.source_node(ctx)
    if clock is not None:
        node = clock.timed(node, READ)
    return timed_stages(node, spec.stages, ctx, clock)
