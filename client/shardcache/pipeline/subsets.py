"""`Dataset.split`, `sample` and `filter`: a pipeline with one more subset step on its source.

The membership rules (which units or rows each step keeps) are the source layer's,
`shardcache.sources.subset`; here each feature checks where it may be called and records its step in the
source's options (so the step is part of the fingerprint). Shard-level kinds (tars, jsonl) cut their shard
list here, once; row- and row-group-level kinds select when their units are listed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardcache.errors import ConfigError
from shardcache.pipeline.spec import PipelineSpec
from shardcache.sources import KINDS
from shardcache.sources.subset import SHARD_LEVEL, Step, normalize_fractions, sample_step, select_shards


def _derive(spec: PipelineSpec, step: Step, what: str) -> PipelineSpec:
    source = spec.source
    if source.kind not in KINDS:
        raise ConfigError(
            f"{what}: a mixed dataset cannot be split or sampled; {what.split('(')[0]} each dataset before "
            "mixing it"
        )
    if spec.cached:
        raise ConfigError(f"{what}: call it before .cache()/.snapshot(), on the dataset being cached")
    shards = source.shards
    if source.kind in SHARD_LEVEL:
        shards = select_shards(source.kind, shards, step)
    subset = (*(source.hints.subset or ()), step)
    return spec.with_source(replace(source, shards=tuple(shards), hints=replace(source.hints, subset=subset)))


def split(spec: PipelineSpec, fractions: Any) -> tuple[PipelineSpec, ...]:
    """`Dataset.split`: one pipeline per fraction, disjoint, together covering `spec`'s source."""
    parts = normalize_fractions(fractions)
    return tuple(_derive(spec, ("split", parts, i), f"split({fractions!r})") for i in range(len(parts)))


def sample(spec: PipelineSpec, fraction: Any, seed: Any = 0) -> PipelineSpec:
    """`Dataset.sample`: a seeded subset of about `fraction` of the source (exact for lance)."""
    return _derive(spec, sample_step(fraction, seed), f"sample({fraction!r}, seed={seed!r})")


def filter_rows(
    spec: PipelineSpec, predicate: str | Sequence[str], index: Mapping[str, Any] | None = None
) -> PipelineSpec:
    """`Dataset.filter`: keep the lance rows matching a predicate (a list: matching any of them).

    `index` is accepted for mvp-dataset compatibility: None or an empty mapping (it has no options).
    """
    if index is not None and (not isinstance(index, Mapping) or index):
        raise ConfigError(f"filter(index={index!r}): no index options are supported; leave it None")
    alternatives = (predicate,) if isinstance(predicate, str) else tuple(predicate)
    if not alternatives or not all(isinstance(p, str) and p.strip() for p in alternatives):
        raise ConfigError(
            f"filter({predicate!r}): expected a Lance SQL predicate or a non-empty list of them"
        )
    source = spec.source
    if source.kind != "lance":
        raise ConfigError(
            f"filter({predicate!r}): only the lance source filters rows (this dataset reads "
            f"{source.kind!r}); use .map() and skip samples downstream instead"
        )
    if spec.stages or source.hints.subset is not None:
        raise ConfigError(
            f"filter({predicate!r}): call filter() right after from_source('lance', ...), before stages, "
            "split() and sample()"
        )
    previous = source.hints.filter
    if previous is None:
        combined: tuple[tuple[str, ...], ...] = tuple((p,) for p in alternatives)
    else:  # filter(a).filter(b): every earlier alternative AND every new one
        combined = tuple((*alt, p) for alt in previous for p in alternatives)
    return spec.with_source(replace(source, hints=replace(source.hints, filter=combined)))
