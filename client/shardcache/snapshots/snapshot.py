"""`Dataset.snapshot(fingerprint_provider=None)`: mvp-dataset 0.2.3's name for `.cache()`.

Without a provider it is `.cache()` exactly: the entry is named by the pipeline's own fingerprint (source,
shard versions, stage code; lambdas and local closures by their code and captured values, taken when
`snapshot()` is called). With one, `fingerprint_provider()` (taking no argument) returns a non-empty string
that names the entry instead: reusing the same string declares the upstream outputs equivalent, so an
upstream change that should not rebuild (a refactor of a map function) keeps the entry, and one that should
(a new tokenizer) changes the string. A provider is needed where the stages' own fingerprint cannot see what
decides the output: a closure over a library object whose state matters (a loaded model or tokenizer is
identified by its type and version only), or a source that is gone or read from elsewhere. It is called once
when `snapshot()` is called, to check it (mvp-dataset calls it there), and again when the entry is built.

Example:
    >>> ds = ds.map(tokenize).snapshot(fingerprint_provider=lambda: "tokenizer-v3")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardcache.errors import ArgumentTypeError, ConfigError
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
        raise ArgumentTypeError(
            f"snapshot(fingerprint_provider={fingerprint_provider!r}): fingerprint_provider must be callable "
            "(taking no argument and returning a non-empty string)",
            code="InvalidFingerprintProvider",
        )
    value = fingerprint_provider()
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"snapshot(fingerprint_provider=...) returned {value!r}: it must return a non-empty string",
            code="InvalidSnapshotFingerprint",
        )
    validate_pre_cache(spec.stages[last_cache(spec.stages) + 1 :])
    # The options (and the source) are checked on a bare copy, which skips fingerprinting the closures: the
    # provider names the entry. The provider is added to the resulting stage.
    checked = cached(spec.with_stages(()), cache_options).stages[-1]
    assert isinstance(checked, CacheStage)
    return spec.then(CacheStage({**checked.options, "fingerprint_provider": fingerprint_provider}))
