"""`split` and `sample`: deterministic subsets of a source, chosen over its list of units.

A subset is a small hashable description kept in the source's hints (``hints.subset``), so it is part
of the pipeline's fingerprint: a tuple of steps applied in order, each over what the previous kept.

- ``("split", fractions, index)``: part `index` of a partition in source order. Fractions are normalised
  (``[8, 2]`` is ``[0.8, 0.2]``); the parts are disjoint and together cover the source.
- ``("sample", fraction, seed)``: a seeded random subset, without replacement, kept in source order.

What a unit is depends on the source, as in mvp-dataset: a row for lance (row-exact: ``split([0.8, 0.2])``
of 10 rows keeps exactly 8 and 2, ``sample(f)`` keeps exactly ``round(f * rows)``), a row group for parquet
(weighted by its row count), a whole shard for tars and jsonl (the fractions are then approximate).

Membership is mvp-dataset 0.2.3's, member for member: the same arguments over the same units keep the same
units (`select` for unit sources, `select_rows` for lance rows; the rules are described at `_split_units`,
`_split_rows`, `_sample_units` and `_sample_rows`). It never depends on the ranks, workers, epoch or resample
round, so every slot agrees and a resampled subset keeps its members in every round. One input beyond the
source and the steps, as in mvp-dataset: a Lance split of a shuffled source (`shuffle_mode` "global" or
"chunk") cuts its windows from the shuffled order of the context seed (`select_rows(split_order=...)`), so
its rows follow that seed. shardcache takes that order once (epoch 0, round 0), where mvp-dataset takes it
again each resample round and so moves rows between the parts.

Everything here is pure: `select` and `select_rows` map unit sizes or a row count to the indices kept. The
`Dataset.split`/`sample`/`filter` features that add a step to a pipeline are `shardcache.pipeline.subsets`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from shardcache.errors import ConfigError
from shardcache.sources.deal.feistel import permute_positions
from shardcache.sources.deal.partition import Unit
from shardcache.sources.kinds import kind_of

U = TypeVar("U", bound=Unit)
S = TypeVar("S")
# ("split", fractions, index) or ("sample", fraction, seed): see split_step, sample_step.
Step = tuple[Any, ...]
Subset = tuple[Step, ...]
SplitOrder = Callable[[int], "np.ndarray[tuple[int], np.dtype[np.int64]]"]
"""A shuffled source's row order over n rows (a permutation of ``range(n)``), for `select_rows`."""


def normalize_fractions(fractions: object) -> tuple[float, ...]:
    """Fractions scaled to sum to 1; ConfigError for an empty list or a non-positive or non-finite value."""
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Sequence) or not fractions:
        raise ConfigError(
            f"fractions={fractions!r}: expected a non-empty list of positive numbers, e.g. [0.8, 0.2]",
            code="InvalidSplitFractions",
        )
    values: list[float] = []
    for value in fractions:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(
                f"fractions={list(fractions)!r}: every fraction must be a positive finite number",
                code="InvalidSplitFractions",
            )
        values.append(float(value))
    total = sum(values)
    return tuple(v / total for v in values)


def split_step(fractions: object, index: int) -> Step:
    """The step keeping part `index` of a split by `fractions`."""
    return ("split", normalize_fractions(fractions), index)


def sample_step(fraction: object, seed: object) -> Step:
    """The step keeping a `fraction` in (0, 1] of the units, chosen from `seed`."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(
            f"fraction={fraction!r}: expected a number in (0, 1] (sampling is without replacement)",
            code="InvalidSampleFraction",
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed={seed!r}: expected an int")
    return ("sample", float(fraction), seed)


def check_subset(subset: object) -> None:
    """Validate a subset (``hints.subset``, as built by `split_step`/`sample_step`)."""
    if not isinstance(subset, tuple) or not subset:
        raise ConfigError(
            f"subset={subset!r}: expected a tuple of split/sample steps (use split() or sample())"
        )
    for step in subset:
        if isinstance(step, tuple) and len(step) == 3 and step[0] == "split":
            fractions = normalize_fractions(step[1])
            if isinstance(step[2], bool) or not isinstance(step[2], int) or not 0 <= step[2] < len(fractions):
                raise ConfigError(f"subset step {step!r}: the part index is out of range")
        elif isinstance(step, tuple) and len(step) == 3 and step[0] == "sample":
            sample_step(step[1], step[2])
        else:
            raise ConfigError(
                f"subset step {step!r}: expected ('split', fractions, index) or ('sample', f, seed)"
            )


def _split_units(weights: Sequence[float], fractions: Sequence[float], index: int) -> list[int]:
    # mvp-dataset's unit rule. Part k ends at the weight bound B_k = (f_0 + ... + f_k) * W (the cumulative
    # fraction summed left to right, then scaled). Units are dealt in order: a unit opens the next part once
    # the weight before it has reached the current part's bound. 5 equal shards split [0.5, 0.5] give 3/2
    # (the bound 2.5 is reached before the fourth), [1, 1, 1] gives 2/2/1.
    total = sum(weights)
    bounds: list[float] = []
    cumulative = 0.0
    for fraction in fractions[:-1]:
        cumulative += fraction
        bounds.append(cumulative * total)
    kept: list[int] = []
    part = 0
    before = 0.0
    for unit, weight in enumerate(weights):
        while part < len(bounds) and before >= bounds[part]:
            part += 1
        if part > index:
            break
        if part == index:
            kept.append(unit)
        before += weight
    return kept


def _split_rows(count: int, fractions: Sequence[float], index: int) -> np.ndarray:
    # mvp-dataset's row rule (lance): part k is rows [round(c_k * n), round(c_{k+1} * n)), c_k the cumulative
    # fraction summed left to right, Python's round (half to even): 5 rows split [0.5, 0.5] give 2/3.
    cuts = [0]
    cumulative = 0.0
    for fraction in fractions[:-1]:
        cumulative += fraction
        cuts.append(max(cuts[-1], min(round(cumulative * count), count)))
    cuts.append(count)
    return np.arange(cuts[index], cuts[index + 1], dtype=np.int64)


def _sample_units(weights: Sequence[float], fraction: float, seed: int) -> list[int]:
    # mvp-dataset's unit rule: rank the units by sha256("{seed}:{index}") and take them in that order while
    # the weight taken is below fraction * W (not rounded: the unit that crosses the target is kept).
    ranked = sorted(range(len(weights)), key=lambda unit: hashlib.sha256(f"{seed}:{unit}".encode()).digest())
    target = fraction * sum(weights)
    kept: list[int] = []
    taken = 0.0
    for unit in ranked:
        if taken >= target:
            break
        kept.append(unit)
        taken += weights[unit]
    return sorted(kept)


def _sample_rows(count: int, fraction: float, seed: int) -> np.ndarray:
    # mvp-dataset's row rule (lance): the images of positions 0 .. round(fraction * n) - 1 under the seeded
    # permutation of [0, n) (`permute_positions`).
    return np.sort(permute_positions(np.arange(round(fraction * count), dtype=np.int64), count, seed))


def select(sizes: Sequence[float] | np.ndarray, subset: Subset | None) -> np.ndarray:
    """The indices of the units a subset keeps, ascending (source order): mvp-dataset's unit rule.

    Each step applies to what the previous one kept, renumbered from 0, as mvp-dataset does when
    ``split``/``sample`` is called on a subset of a unit source.

    Args:
        sizes: One weight per unit, in source order: the row group's row count (parquet), 1 per shard
            (tars, jsonl).
        subset: The steps (``hints.subset``); None keeps every unit.

    Example:
        >>> select([1] * 10, (("split", (0.8, 0.2), 1),)).tolist()
        [8, 9]
    """
    kept = np.arange(len(sizes), dtype=np.int64)
    if not subset:
        return kept
    weights = [float(size) for size in sizes]
    for step in subset:
        current = [weights[unit] for unit in kept]
        if step[0] == "split":
            local = _split_units(current, step[1], step[2])
        else:
            local = _sample_units(current, step[1], step[2])
        kept = kept[np.asarray(local, dtype=np.int64)]
    return kept


def select_rows(count: int, subset: Subset | None, split_order: SplitOrder | None = None) -> np.ndarray:
    """The rows of a row space of `count` rows a subset keeps, ascending: mvp-dataset's row rule (lance).

    Splits cut at ``round(cumulative fraction * rows)``; a sample keeps the images of the first
    ``round(fraction * rows)`` positions under the seeded permutation (`permute_positions`). Steps stack,
    each over what the previous kept (mvp-dataset refuses a second Lance step).

    `split_order(n)`, when given, is the order of a shuffled source over `n` rows (a permutation of
    ``range(n)``): a split then cuts its windows from that order, so its membership follows the source's
    shuffle seed, as mvp-dataset's does under `shuffle_mode="global"`/`"chunk"`. Samples are seeded by
    their own `seed` and ignore it.

    Example:
        >>> select_rows(5, (("split", (0.5, 0.5), 0),)).tolist()
        [0, 1]
    """
    kept = np.arange(count, dtype=np.int64)
    for step in subset or ():
        if step[0] == "split":
            window = _split_rows(len(kept), step[1], step[2])
            if split_order is not None:
                window = np.sort(np.asarray(split_order(len(kept)), dtype=np.int64)[window])
            kept = kept[window]
        else:
            kept = kept[_sample_rows(len(kept), step[1], step[2])]
    return kept


def select_units(kind: str, units: Sequence[U], subset: Subset | None) -> Sequence[U]:
    """The units of a source a subset keeps (the reader-side hook, for unit lists built at iteration).

    Parquet row groups are weighted by their row count (`Unit.count`). Shard-level kinds (tars, jsonl) were
    already cut when split()/sample() was called and lance selects rows itself, so both pass through.

    Raises:
        ConfigError: the subset keeps no unit (name the source's kind and what to change).
    """
    # Kinds of whole shards were cut from the shard list when split()/sample() was called (`select_shards`,
    # so the readers' unit lists, which may depend on the slot count, are untouched); row-level kinds cut
    # their rows themselves.
    if not subset or kind_of(kind).subset_level != "unit":
        # A list is copied (a kind may refill its copy per epoch: lance); a lazy one stays lazy (tars).
        return list(units) if isinstance(units, list) else units
    sizes = [1 if u.count is None else int(u.count) for u in units]
    kept = [units[i] for i in select(sizes, subset)]
    if units and not kept:
        raise ConfigError(
            f"{kind}: the subset {describe_subset(subset)} keeps none of the {len(units)} row groups; "
            "use a larger fraction or write smaller row groups",
            code="InsufficientSubsetUnits",
        )
    return kept


def select_shards(kind: str, shards: Sequence[S], step: Step, min_units: int = 1) -> tuple[S, ...]:
    """Shard-level subsets (tars, jsonl): the shards one step keeps, weighted one per shard.

    Args:
        min_units: The fewest shards the subset may keep: the slots (ranks x workers) of the dataset's
            context, as mvp-dataset requires (a whole-shard subset with fewer shards than slots leaves some
            slots without data), and at least 1.

    Raises:
        ConfigError: `[InsufficientSubsetUnits]`, the step keeps fewer than `min_units` shards.
    """
    kept = tuple(shards[i] for i in select([1] * len(shards), (step,)))
    needed = max(1, min_units)
    if len(kept) < needed:
        slots = f", fewer than the {needed} slots (ranks x workers) that read it" if needed > 1 else ""
        raise ConfigError(
            f"{kind}: {describe_subset((step,))} keeps {len(kept)} of the {len(shards)} shards{slots} (a "
            f"{kind} subset is whole shards); use a larger fraction or more, smaller shards",
            code="InsufficientSubsetUnits",
        )
    return kept


def describe_subset(subset: Subset) -> str:
    """A short human form, e.g. ``split([0.8, 0.2])[1].sample(0.1, seed=0)``."""
    parts = []
    for step in subset:
        if step[0] == "split":
            parts.append(f"split({[round(f, 6) for f in step[1]]})[{step[2]}]")
        else:
            parts.append(f"sample({step[1]}, seed={step[2]})")
    return ".".join(parts)
