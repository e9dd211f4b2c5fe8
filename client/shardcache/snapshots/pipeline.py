"""Iterate one cache part: the pre-cache pipeline for one data-parallel slot, leading maps in parallel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from shardcache.context import RuntimeContext
from shardcache.errors import ArgumentTypeError, ConfigError
from shardcache.node import Node, State
from shardcache.snapshots.parallel import parallel_map
from shardcache.spec import NodeBuilder, PipelineSpec
from shardcache.stages.cache import CacheStage
from shardcache.stages.map import MapStage

if TYPE_CHECKING:
    from shardcache.sources.lance.rows import Row


class _StreamNode(Node):
    """A plain iterator as the upstream of stage nodes (a build never resumes, so it has no state)."""

    def __init__(self, items: Iterator[object]) -> None:
        super().__init__()
        self._items = items

    def gen(self) -> Iterator[object]:
        return self._items

    def state_dict(self) -> State:
        return {}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()


def dict_samples(samples: Iterator[object]) -> Iterator[Row]:
    """`samples`, each checked to be a dict: a snapshot row is a dict of fields (mvp's TypeError)."""
    for sample in samples:
        if not isinstance(sample, dict):
            raise ArgumentTypeError(
                f".cache()/.snapshot(): expected dict sample, got {type(sample).__name__}; the stages "
                "before the snapshot must yield dicts of fields (map to a dict, or move the stage after it)",
                code="InvalidSnapshotSample",
            )
        yield sample


# mvp-dataset's snapshot rows: the upstream's provenance under new names (the snapshot's own Lance source
# assigns `__key__` and `__file__` when it is read), and its row indexes dropped (the snapshot renumbers).
SOURCE_METADATA_ALIASES = {"__key__": "__source_key__", "__file__": "__source_file__"}
REPLACED_METADATA = ("__local_index__", "__global_index__")


def source_metadata_aliased(samples: Iterator[Row]) -> Iterator[Row]:
    """`samples` as `snapshot()` stores them: `__key__`/`__file__` renamed, row indexes dropped.

    Raises:
        ConfigError: a sample holds both a field and its alias (`__key__` and `__source_key__`): one of
            them would be lost (mvp's `[SnapshotSourceMetadataConflict]`).
    """
    for sample in samples:
        row = dict(sample)  # the upstream's dict is left as it was
        for name, alias in SOURCE_METADATA_ALIASES.items():
            if name not in row:
                continue
            if alias in row:
                raise ConfigError(
                    f"snapshot(): a sample holds both {name!r} and {alias!r}; the snapshot stores the "
                    f"upstream {name!r} as {alias!r}. Rename or drop one of them before snapshot()",
                    code="SnapshotSourceMetadataConflict",
                )
            row[alias] = row.pop(name)
        for name in REPLACED_METADATA:
            row.pop(name, None)
        yield row


def iterate_part(
    pre: PipelineSpec, context: RuntimeContext, workers: int, build_nodes: NodeBuilder
) -> Iterator[Row]:
    """The samples `pre` yields for `context`, built from the pipeline's own source and stage nodes.

    With `workers > 1`, the leading contiguous `map` stages run on a worker pool (in order, bounded in
    flight) and the remaining stages run on the merged stream in declaration order, so `shuffle` and
    `assemble` see exactly the stream they would see without parallelism.

    Args:
        pre: The pipeline before the cache boundary.
        context: The part's context (rank = the part's slot, one worker).
        workers: `cache_num_workers`.
        build_nodes: Builds `pre` whole when it has an earlier `.cache()` boundary of its own.
    """
    stages = list(pre.stages)
    if any(isinstance(stage, CacheStage) for stage in stages):
        # An earlier .cache() boundary: the pipeline resolves it (materialising it first) when building.
        inner = build_nodes(pre, context)
        try:
            yield from inner
        finally:
            inner.close()
        return
    lead = 0
    while lead < len(stages) and isinstance(stages[lead], MapStage):
        lead += 1
    source = pre.source_node(context)
    node: Node = source
    if workers > 1 and lead:
        maps = [stage.fn for stage in stages[:lead] if isinstance(stage, MapStage)]
        node = _StreamNode(parallel_map(node, maps, workers))
        stages = stages[lead:]
    for stage in stages:
        node = stage.node(node, context)
    try:
        yield from node
    finally:
        node.close()
        source.close()
