"""Iterate one cache part: the pre-cache pipeline for one data-parallel slot, leading maps in parallel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardcache.cache.parallel import parallel_map
from shardcache.stages.base import Node, State


class _StreamNode(Node):
    """A plain iterator as the upstream of stage nodes (a build never resumes, so it has no state)."""

    def __init__(self, items: Iterator[Any]) -> None:
        super().__init__()
        self._items = items

    def gen(self) -> Iterator[Any]:
        return self._items

    def state_dict(self) -> State:
        return {}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()


def _source_node(pre: Any, context: Any) -> Node:
    from shardcache.sources import node_class

    node: Node = node_class(pre.source.kind)(pre.source, context)
    return node


def iterate_part(pre: Any, context: Any, workers: int) -> Iterator[dict[str, Any]]:
    """The samples `pre` yields for `context`, built from the pipeline's own source and stage nodes.

    With `workers > 1`, the leading contiguous `map` stages run on a worker pool (in order, bounded in
    flight) and the remaining stages run on the merged stream in declaration order, so `shuffle` and
    `assemble` see exactly the stream they would see without parallelism.

    Args:
        pre: The Dataset before the cache boundary (`source`, `stages`).
        context: The part's context (rank = the part's slot, one worker).
        workers: `cache_num_workers`.
    """
    stages = list(pre.stages)
    if any(stage.kind == "cache" for stage in stages):
        # An earlier .cache() boundary: the pipeline resolves it (materialising it first) when building.
        inner: Node = pre.build(context)
        try:
            yield from inner
        finally:
            inner.close()
        return
    lead = 0
    while lead < len(stages) and stages[lead].kind == "map":
        lead += 1
    source = node = _source_node(pre, context)
    if workers > 1 and lead:
        node = _StreamNode(parallel_map(node, [stage.fn for stage in stages[:lead]], workers))
        stages = stages[lead:]
    for stage in stages:
        node = stage.node(node, context)
    try:
        yield from node
    finally:
        node.close()
        source.close()
