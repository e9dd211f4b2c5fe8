"""`build(spec, ctx)`: one slot's node chain of a pipeline — the root's node, then one node per stage.

A `.cache()` boundary is resolved first (`shardcache.snapshots.boundary.cut_at_cache`: materialised once,
then read back as a Lance source), so only the stages after it run on every pass. A composed root (a mix)
builds its own node, and builds its members with this same function.
"""

from __future__ import annotations

from shardcache.context import RuntimeContext
from shardcache.node import Node
from shardcache.snapshots.boundary import cut_at_cache
from shardcache.spec import ComposedSource, PipelineSpec


def build(spec: PipelineSpec, ctx: RuntimeContext) -> Node:
    """The node chain of `spec` for the slot `ctx` names."""
    spec = cut_at_cache(spec, ctx, build)
    node: Node
    if isinstance(spec.source, ComposedSource):
        node = spec.source.node(ctx)
    else:
        node = spec.source_node(ctx)
    for stage in spec.stages:
        node = stage.node(node, ctx)
    return node
