"""The `.cache()` boundary as the Dataset facade sees it: checking the stage, and cutting a pipeline there.

`Dataset.cache()` adds a `CacheStage` (`cache_stage`); building the pipeline for a slot replaces
everything up to the last cache stage with a Lance source over what `shardcache.cache.materialise` wrote
(`cut_at_cache`), so only the stages after it run on every pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardcache.errors import ConfigError
from shardcache.shards import ShardRef
from shardcache.sources import SourceSpec
from shardcache.stages import CacheStage, Stage, builders

if TYPE_CHECKING:
    from shardcache.context import RuntimeContext

CACHE_DEFAULTS: dict[str, Any] = {
    "cache_dir": ".cache",
    "cache_num_workers": 1,
    "cache_write_batch_size": 1024,
    "max_rows_per_fragment": 5000,
}


def _last_cache(stages: Sequence[Stage]) -> int:
    return max((i for i, s in enumerate(stages) if s.kind == "cache"), default=-1)


def cache_stage(source: SourceSpec, stages: Sequence[Stage], options: dict[str, Any]) -> CacheStage:
    """The cache stage `Dataset.cache(**options)` appends to `stages` over `source`, checked.

    Raises:
        ConfigError: after a mix, a non-positive size, or a stage that cannot go into a cache.
    """
    if source.kind == "mix":
        raise ConfigError(
            "cache() after mix() is not supported: cache each dataset before mixing "
            "(Dataset.mix({'a': a.cache(), 'b': b.cache()}))"
        )
    builders.positive_int("cache_num_workers", options["cache_num_workers"])
    builders.positive_int("cache_write_batch_size", options["cache_write_batch_size"])
    builders.positive_int("max_rows_per_fragment", options["max_rows_per_fragment"])
    try:
        from shardcache.cache import validate_pre_cache
    except ImportError:  # the cache package is optional at this layer
        pass
    else:
        validate_pre_cache(tuple(stages)[_last_cache(stages) + 1 :])
    return CacheStage(options)


def cut_at_cache(
    source: SourceSpec, stages: tuple[Stage, ...], ctx: RuntimeContext
) -> tuple[SourceSpec, tuple[Stage, ...]]:
    """The source and stages to build for `ctx`: after the last cache stage, materialised first."""
    last = _last_cache(stages)
    if last < 0:
        return source, stages
    from shardcache.cache import materialise
    from shardcache.dataset import Dataset

    cache = stages[last]
    assert isinstance(cache, CacheStage)
    path = materialise(Dataset(source, stages[:last]), ctx, dict(cache.options))
    # row_metadata=False: the cached rows keep the metadata of the samples written (see sources.lance_rows).
    options = {"shuffle_mode": "none", "row_metadata": False}
    return SourceSpec("lance", (ShardRef(path),), options, None, None), stages[last + 1 :]
