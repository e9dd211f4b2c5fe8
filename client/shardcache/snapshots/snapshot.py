"""`Dataset.snapshot(fingerprint_provider=None)`: mvp-dataset 0.2.3's name for `.cache()`.

Without a provider it is `.cache()` exactly: the entry is named by the pipeline's own fingerprint (source,
shard versions, stage code). With one, `fingerprint_provider()` (called once per materialisation, taking no
argument) returns a non-empty string that names the entry instead: reusing the same string declares the
upstream outputs equivalent, so an upstream change that should not rebuild (a refactor of a map function)
keeps the entry, and one that should (a new tokenizer) changes the string. Stage callables before such a
snapshot need no stable identity (lambdas are accepted), since the provider names the entry.

Example:
    >>> ds = ds.map(tokenize).snapshot(fingerprint_provider=lambda: "tokenizer-v3")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardcache.errors import ConfigError
from shardcache.pipeline.spec import PipelineSpec
from shardcache.snapshots.boundary import cached, last_cache
from shardcache.snapshots.identity import validate_pre_cache
from shardcache.stages import CacheStage

FingerprintProvider = Callable[[], str]
"""mvp-dataset's name for what `snapshot(fingerprint_provider=...)` takes: no argument, a non-empty string."""


def snapshot(
    spec: PipelineSpec, fingerprint_provider: FingerprintProvider | None = None, **cache_options: Any
) -> PipelineSpec:
    """`spec` cached with `cache_options` (`.cache()`), named by `fingerprint_provider()` if given."""
    if fingerprint_provider is None:
        return cached(spec, cache_options)
    if not callable(fingerprint_provider):
        raise ConfigError(
            f"snapshot(fingerprint_provider={fingerprint_provider!r}): expected a callable taking no "
            "argument and returning a non-empty string"
        )
    validate_pre_cache(spec.stages[last_cache(spec.stages) + 1 :], identified=True)
    # The options (and the stages, which would refuse lambdas) are checked on a bare copy; the provider is
    # added to the resulting stage.
    checked = cached(spec.with_stages(()), cache_options).stages[-1]
    assert isinstance(checked, CacheStage)
    return spec.then(CacheStage({**checked.options, "fingerprint_provider": fingerprint_provider}))
