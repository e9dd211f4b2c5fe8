"""The `.cache()` boundary: checking the stage, and cutting a pipeline there.

`Dataset.cache()` adds a `CacheStage` (`cache_stage`); building the pipeline for a slot replaces
everything up to the last cache stage with a Lance source over what `shardcache.snapshots.materialise`
wrote (`cut_at_cache`), so only the stages after it run on every pass.
"""

from __future__ import annotations

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, positive_int
from shardcache.shards import ShardRef
from shardcache.snapshots import materialise, validate_pre_cache
from shardcache.snapshots.identity import frozen_identities
from shardcache.sources import SourceSpec
from shardcache.sources.options import PlanHints
from shardcache.spec import NodeBuilder, PipelineSpec
from shardcache.stages import CacheStage, Stage
from shardcache.stages.cache import SNAPSHOT_IDENTITY, SNAPSHOT_SUBSET

CACHE_DEFAULTS: dict[str, object] = {
    "cache_dir": ".cache",
    "cache_num_workers": 1,
    "cache_write_batch_size": 1024,
    "max_rows_per_fragment": 5000,
}


def last_cache(stages: tuple[Stage, ...]) -> int:
    return max((i for i, s in enumerate(stages) if isinstance(s, CacheStage)), default=-1)


def cache_stage(spec: PipelineSpec, options: dict[str, object]) -> CacheStage:
    """The cache stage `Dataset.cache(**options)` appends to `spec`, checked.

    Raises:
        ConfigError: after a mix or a resampling source, a non-positive size, or a stage that cannot go
            into a cache.
    """
    if spec.composed:
        raise ConfigError(
            "cache() after mix() is not supported: cache each dataset before mixing "
            "(Dataset.mix({'a': a.cache(), 'b': b.cache()}))"
        )
    if spec.source.resample:
        raise ConfigError(
            ".cache()/.snapshot() requires a finite pipeline: a resampling source (resample=True) never "
            "ends; drop resample",
            code="InfiniteSnapshotSource",
        )
    positive_int("cache_num_workers", options["cache_num_workers"])
    positive_int("cache_write_batch_size", options["cache_write_batch_size"])
    positive_int("max_rows_per_fragment", options["max_rows_per_fragment"])
    validate_pre_cache(spec.stages[last_cache(spec.stages) + 1 :])
    frozen = frozen_identities(spec.stages)
    # Only when there is a closure, so the description (and fingerprint) of other pipelines is unchanged.
    return CacheStage({**options, "frozen": frozen} if any(frozen) else options)


def cached(spec: PipelineSpec, options: dict[str, object]) -> PipelineSpec:
    """`spec.cache(**options)`: `spec` with a checked cache stage appended (defaults: `CACHE_DEFAULTS`)."""
    return spec.then(cache_stage(spec, {**CACHE_DEFAULTS, **options}))


def cut_at_cache(spec: PipelineSpec, ctx: RuntimeContext, build_nodes: NodeBuilder) -> PipelineSpec:
    """The pipeline to build for `ctx`: a Lance source over the materialised part before the last cache
    stage, and the stages after it (`spec` itself without a cache stage)."""
    last = last_cache(spec.stages)
    if last < 0:
        return spec
    cache = spec.stages[last]
    assert isinstance(cache, CacheStage)
    options = dict(cache.options)
    subset = options.pop(SNAPSHOT_SUBSET, None)  # split()/sample() of the snapshot (`pipeline.subsets`)
    path = materialise(spec.with_stages(spec.stages[:last]), ctx, options, build_nodes)
    # `.cache()` rows keep the metadata of the samples written (row_metadata=False, see
    # sources.lance.rows); snapshot() rows get the metadata of the snapshot's own dataset, as in mvp-dataset
    # (the upstream's was stored as __source_key__/__source_file__).
    fresh_metadata = options.get(SNAPSHOT_IDENTITY) is not None
    hints = PlanHints(row_metadata=fresh_metadata, subset=subset or None)
    lance = SourceSpec("lance", (ShardRef(path),), {"shuffle_mode": "none"}, None, None, hints)
    return PipelineSpec(lance, spec.stages[last + 1 :])
