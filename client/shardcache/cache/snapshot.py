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
from typing import TYPE_CHECKING, Any

from shardcache.errors import ConfigError

if TYPE_CHECKING:
    from shardcache.dataset import Dataset

FingerprintProvider = Callable[[], str]
"""mvp-dataset's name for what `snapshot(fingerprint_provider=...)` takes: no argument, a non-empty string."""


def snapshot(
    dataset: Dataset, fingerprint_provider: FingerprintProvider | None = None, **cache_options: Any
) -> Dataset:
    """`dataset.cache(**cache_options)`, named by `fingerprint_provider()` when one is given."""
    if fingerprint_provider is None:
        return dataset.cache(**cache_options)
    if not callable(fingerprint_provider):
        raise ConfigError(
            f"snapshot(fingerprint_provider={fingerprint_provider!r}): expected a callable taking no "
            "argument and returning a non-empty string"
        )
    from shardcache.cache.identity import validate_pre_cache
    from shardcache.stages import CacheStage

    pre = dataset.stages
    last = max((i for i, s in enumerate(pre) if s.kind == "cache"), default=-1)
    validate_pre_cache(pre[last + 1 :], identified=True)
    # .cache() validates the options (and the stages, which would refuse lambdas) on a bare copy; the
    # provider is added to the resulting stage.
    checked = dataset.with_stages(()).cache(**cache_options).stages[-1]
    assert isinstance(checked, CacheStage)
    options = {**checked.options, "fingerprint_provider": fingerprint_provider}
    return dataset.with_stages((*pre, CacheStage(options)))
