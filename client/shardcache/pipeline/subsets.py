"""`Dataset.split`, `sample` and `filter`: a pipeline with one more subset step on its source.

The membership rules (which units or rows each step keeps) are the source layer's,
`shardcache.sources.deal.subset`; here each feature checks where it may be called and records its step in the
source's options (so the step is part of the fingerprint). Shard-level kinds (tars, jsonl) cut their shard
list here, once; row- and row-group-level kinds select when their units are listed.

Right after `.cache()`/`.snapshot()`, `split`/`sample` choose rows of the materialised dataset (its row
space, in the order it was written), as mvp-dataset 0.2.3 does: the step goes in the cache stage's options
(`SNAPSHOT_SUBSET`) and `snapshots.boundary.cut_at_cache` hands it to the Lance source that reads the
snapshot. One such step per snapshot, as in mvp ([UnsupportedNestedSnapshotSubset]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardcache.errors import ArgumentTypeError, ConfigError, UnsupportedOperation
from shardcache.sources.deal.subset import Step, normalize_fractions, sample_step, select_shards
from shardcache.sources.kinds import kind_of, registered
from shardcache.spec import PipelineSpec
from shardcache.stages import CacheStage
from shardcache.stages.cache import SNAPSHOT_SUBSET


def _derive(spec: PipelineSpec, step: Step, what: str, min_units: int) -> PipelineSpec:
    source = spec.source
    if source.kind not in registered():
        raise ConfigError(
            f"{what}: a mixed dataset cannot be split or sampled; {what.split('(')[0]} each dataset before "
            "mixing it",
            code="UnsupportedSubsetSource",
        )
    if spec.cached:
        return _derive_snapshot(spec, step, what)
    shards = source.shards
    if kind_of(source.kind).subset_level == "shard":
        shards = select_shards(source.kind, shards, step, min_units)
    subset = (*(source.hints.subset or ()), step)
    return spec.with_source(replace(source, shards=tuple(shards), hints=replace(source.hints, subset=subset)))


def _derive_snapshot(spec: PipelineSpec, step: Step, what: str) -> PipelineSpec:
    # The snapshot's rows are a Lance row space: the step is row-exact, as for a lance source.
    cache = spec.stages[-1]
    if not isinstance(cache, CacheStage):
        raise ConfigError(
            f"{what}: call it right after .cache()/.snapshot() (it chooses rows of the snapshot), before "
            "the stages that follow it",
            code="InvalidSubsetPlacement",
        )
    if SNAPSHOT_SUBSET in cache.options:
        raise ConfigError(
            f"{what}: this snapshot is already split or sampled; apply split()/sample() on the base snapshot",
            code="UnsupportedNestedSnapshotSubset",
        )
    chosen = CacheStage({**cache.options, SNAPSHOT_SUBSET: (step,)})
    return spec.with_stages((*spec.stages[:-1], chosen))


def split(spec: PipelineSpec, fractions: Sequence[float], min_units: int = 1) -> tuple[PipelineSpec, ...]:
    """`Dataset.split`: one pipeline per fraction, disjoint, together covering `spec`'s source.

    `min_units`: the fewest shards a part of a tars or jsonl source may keep (`select_shards`).
    """
    parts = normalize_fractions(fractions)
    what = f"split({fractions!r})"
    return tuple(_derive(spec, ("split", parts, i), what, min_units) for i in range(len(parts)))


def sample(spec: PipelineSpec, fraction: float, seed: int = 0, min_units: int = 1) -> PipelineSpec:
    """`Dataset.sample`: a seeded subset of about `fraction` of the source (exact for lance)."""
    what = f"sample({fraction!r}, seed={seed!r})"
    return _derive(spec, sample_step(fraction, seed), what, min_units)


def _predicates(predicate: object) -> tuple[str, ...]:
    """The stripped predicates of one filter() call, duplicates dropped, in the order given (mvp's checks
    and error types: TypeError for a non-string, ValueError for an empty one or an empty list)."""
    if isinstance(predicate, str):
        given: tuple[object, ...] = (predicate,)
    elif isinstance(predicate, Sequence):
        given = tuple(predicate)
    else:
        raise ArgumentTypeError(
            f"filter({predicate!r}): predicate must be a string or sequence of strings",
            code="InvalidLanceFilter",
        )
    if not given:
        raise ConfigError("filter([]): predicate sequence must be non-empty", code="InvalidLanceFilter")
    kept: list[str] = []
    for item in given:
        if not isinstance(item, str):
            raise ArgumentTypeError(
                f"filter({predicate!r}): every predicate must be a string", code="InvalidLanceFilter"
            )
        if not item.strip():
            raise ConfigError(
                f"filter({predicate!r}): predicate must be non-empty", code="InvalidLanceFilter"
            )
        kept.append(item.strip())
    return tuple(dict.fromkeys(kept))


def filter_rows(
    spec: PipelineSpec, predicate: str | Sequence[str], index: Mapping[str, Any] | None = None
) -> PipelineSpec:
    """`Dataset.filter`: keep the lance rows matching a predicate (a list: matching any of them).

    `hints.filter` holds one group per filter() call: a row is kept when it matches some predicate of
    every group (OR inside a group, AND across calls), as in mvp-dataset, whose scans we mirror: each
    predicate is evaluated on its own, and two single-predicate calls in a row are merged into one
    ``(a) AND (b)`` predicate. `index` is accepted for mvp-dataset compatibility: None or an empty mapping.
    """
    source = spec.source
    if source.kind not in registered() or not kind_of(source.kind).filters_rows:
        raise UnsupportedOperation(
            f"filter({predicate!r}): only the lance source filters rows (this dataset reads "
            f"{source.kind!r}); use .map() and skip samples downstream instead",
            code="UnsupportedFilter",
        )
    if spec.stages or source.hints.subset is not None:
        raise ConfigError(
            f"filter({predicate!r}): call filter() right after from_source('lance', ...), before stages, "
            "split() and sample()",
            code="InvalidFilterPlacement",
        )
    group = _predicates(predicate)
    if index is not None and not isinstance(index, Mapping):
        raise ArgumentTypeError(
            f"filter(index={index!r}): index must be a mapping", code="InvalidLanceFilterIndexConfig"
        )
    if index:
        raise ConfigError(
            f"filter(index=...): unknown config key(s) {', '.join(sorted(map(str, index)))}; no index "
            "options are supported; leave it None",
            code="InvalidLanceFilterIndexConfig",
        )
    groups: tuple[tuple[str, ...], ...] = source.hints.filter or ()
    if groups and len(groups[-1]) == 1 and len(group) == 1:
        groups, group = groups[:-1], (f"({groups[-1][0]}) AND ({group[0]})",)
    return spec.with_source(replace(source, hints=replace(source.hints, filter=(*groups, group))))
