"""`Dataset.snapshot(fingerprint_provider=None)`: mvp-dataset 0.2.3's snapshot, built on `.cache()`.

It materialises like `.cache()` (same options, parts and merge), with mvp-dataset's two differences:

- The entry is named when `snapshot()` is called, as mvp-dataset names it then: by the pipeline's own
  fingerprint (source, shard versions, stage code; lambdas and local closures by their code and captured
  values), or by `fingerprint_provider()` if given. Iterating never reads the upstream source again once
  the entry is complete, so a snapshot keeps being read after its source is deleted or moved ("later
  iterations open the cached Lance source without executing the upstream source or stages"). `.cache()`
  instead re-reads the source's version at each iteration, to rebuild when the source changes.
- Rows store the upstream `__key__`/`__file__` as `__source_key__`/`__source_file__`, drop the upstream
  `__local_index__`/`__global_index__`, and are read back with fresh row metadata of the snapshot's own
  Lance dataset (`pipeline.source_metadata_aliased`). `.cache()` rows keep their metadata as written.

A provider (taking no argument, returning a non-empty string) is needed where the stages' own fingerprint
cannot see what decides the output: a closure over a library object whose state matters (a loaded model or
tokenizer is identified by its type and version only). Equal strings declare equal outputs. It is called
once, when `snapshot()` is called.

Example:
    >>> ds = ds.map(tokenize).snapshot(fingerprint_provider=lambda: "tokenizer-v3")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardcache.errors import ArgumentTypeError, ConfigError
from shardcache.snapshots.boundary import cached, last_cache
from shardcache.snapshots.identity import (
    plan_fingerprint,
    provided_fingerprint,
    snapshot_entry_name,
    validate_pre_cache,
)
from shardcache.spec import PipelineSpec
from shardcache.stages import CacheStage
from shardcache.stages.cache import SNAPSHOT_IDENTITY

FingerprintProvider = Callable[[], str]
"""mvp-dataset's name for what `snapshot(fingerprint_provider=...)` takes: no argument, a non-empty string."""


def snapshot(
    spec: PipelineSpec, fingerprint_provider: FingerprintProvider | None = None, **cache_options: Any
) -> PipelineSpec:
    """`spec` cached with `cache_options` (`.cache()`), named by `fingerprint_provider()` if given."""
    if fingerprint_provider is None:
        stage = cached(spec, cache_options).stages[-1]
        assert isinstance(stage, CacheStage)
        # The plan fingerprint now (it reads the source's shard versions), not at each iteration.
        name, _ = plan_fingerprint(spec.source, spec.stages, stage.options.get("frozen", ()))
        return spec.then(CacheStage({**stage.options, SNAPSHOT_IDENTITY: snapshot_entry_name(name)}))
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
    # provider names the entry.
    checked = cached(spec.with_stages(()), cache_options).stages[-1]
    assert isinstance(checked, CacheStage)
    name, _ = provided_fingerprint(lambda: value, spec.source, spec.stages)
    options = {**checked.options, "fingerprint_provider": fingerprint_provider}
    return spec.then(CacheStage({**options, SNAPSHOT_IDENTITY: snapshot_entry_name(name)}))
