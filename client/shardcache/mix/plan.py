"""The arithmetic of weighted mixing: sampling ratios, the virtual epoch size and per-source counts.

This follows fairseq's SampledMultiDataset (seed 003): ratios come from weights (by default the dataset
sizes), temperature flattens them as p_i ∝ w_i^(1/T), the virtual epoch size keeps the largest dataset at
its size and scales the others relative to it (so with T >= 1 and size weights nothing is downsampled),
capped at ``max_scale_up`` × the real total. Counts are ``floor(V · p_i)``; the rounding remainder is
assigned by an RNG seeded from (seed, epoch), so every machine computes the same counts for one epoch.

Everything here is pure: no I/O, no dataset objects, only numbers.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardcache.errors import ConfigError

logger = logging.getLogger(__name__)

# A fixed tag mixed into every seed sequence, so mixing never draws the same stream as a shuffle stage.
_RNG_TAG = int(hashlib.sha1(b"shardcache.mix").hexdigest(), 16) % (2**32)


def epoch_rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    """The deterministic RNG of one (seed, epoch[, extra...]): the same numbers on every machine."""
    return np.random.default_rng([_RNG_TAG, seed % (2**32), epoch % (2**32), *(e % (2**32) for e in extra)])


def sampling_probabilities(weights: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Temperature-scaled sampling probabilities: p_i ∝ (w_i / Σw)^(1/T).

    Args:
        weights: One positive weight per source (dataset sizes by default).
        temperature: T > 0; T = 1 keeps the weights' ratios, larger T flattens them towards uniform.

    Example:
        >>> [round(p, 3) for p in sampling_probabilities([900, 100], temperature=2.0)]
        [0.75, 0.25]
    """
    if not weights:
        raise ConfigError("mix needs at least one dataset")
    if not temperature > 0:
        raise ConfigError(f"temperature must be > 0, got {temperature!r}")
    for i, w in enumerate(weights):
        if not w > 0:
            raise ConfigError(f"weights must be > 0, got {w!r} for source #{i}; drop the source instead")
    total = float(sum(weights))
    scaled = [(w / total) ** (1.0 / temperature) for w in weights]
    norm = sum(scaled)
    return [s / norm for s in scaled]


def default_virtual_size(
    sizes: Sequence[int], probabilities: Sequence[float], max_scale_up: float = 1.5
) -> int:
    """The virtual epoch size: the largest source keeps its size and the others scale relative to it.

    ``V = Σ_i (p_i / p_L) · n_L`` where L is the largest source, capped at ``max_scale_up · Σ n_i``.
    """
    if not max_scale_up > 0:
        raise ConfigError(f"max_scale_up must be > 0, got {max_scale_up!r}")
    largest = int(np.argmax(sizes))
    p_l, n_l = probabilities[largest], sizes[largest]
    vsize = sum((p / p_l) * n_l for p in probabilities)
    max_size = sum(sizes) * max_scale_up
    return int(vsize if vsize < max_size else max_size)


def sample_counts(probabilities: Sequence[float], virtual_size: int, rng: np.random.Generator) -> list[int]:
    """Per-source counts: ``floor(V · p_i)``, the rounding remainder drawn from ``rng`` with weights p."""
    counts = np.array([int(virtual_size * p) for p in probabilities], dtype=np.int64)
    diff = virtual_size - int(counts.sum())
    if diff > 0:
        p = np.asarray(probabilities, dtype=np.float64)
        for i in rng.choice(len(probabilities), size=diff, p=p / p.sum()):
            counts[i] += 1
    return [int(c) for c in counts]


@dataclass(frozen=True)
class MixPlan:
    """The counts of one mixed epoch (the whole job, before splitting across slots)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    probabilities: tuple[float, ...]
    virtual_size: int
    counts: tuple[int, ...]
    epoch: int

    def log(self) -> None:
        """Log raw and resampled sizes per source, as fairseq does, and warn on a virtual size below real."""
        raw_total = sum(self.sizes)
        logger.info(
            "mix epoch %d: raw sizes %s; raw total size %d",
            self.epoch,
            dict(zip(self.names, self.sizes, strict=True)),
            raw_total,
        )
        logger.info(
            "mix epoch %d: resampled sizes %s; resampled total size %d; upsampling ratios %s",
            self.epoch,
            dict(zip(self.names, self.counts, strict=True)),
            self.virtual_size,
            {n: round(c / s, 4) for n, c, s in zip(self.names, self.counts, self.sizes, strict=True)},
        )
        if self.virtual_size < raw_total:
            logger.warning(
                "virtual data size (%d) is less than real data size (%d): some samples are not seen this "
                "epoch. Raise virtual_size or max_scale_up if that is not intended.",
                self.virtual_size,
                raw_total,
            )


def plan_mix(
    names: Sequence[str],
    sizes: Sequence[int],
    *,
    weights: Sequence[float] | None = None,
    temperature: float = 1.0,
    virtual_size: int | None = None,
    max_scale_up: float = 1.5,
    seed: int = 0,
    epoch: int = 0,
) -> MixPlan:
    """Compute the counts of one mixed epoch.

    Args:
        names: One name per source.
        sizes: Real number of samples per source (all > 0).
        weights: Sampling weights; None means the sizes.
        temperature: Temperature T of p_i ∝ w_i^(1/T).
        virtual_size: Samples in the mixed epoch; None means `default_virtual_size`.
        max_scale_up: Cap of the default virtual size, as a multiple of the real total.
        seed: Job seed; with `epoch` it seeds the rounding of the counts.
        epoch: The epoch.

    Returns:
        The plan; ``sum(plan.counts) == plan.virtual_size``.
    """
    if len(names) != len(sizes):
        raise ConfigError(f"got {len(names)} names for {len(sizes)} sizes")
    for name, size in zip(names, sizes, strict=True):
        if size <= 0:
            raise ConfigError(f"mix source {name!r} has no samples; check its shards or drop it from the mix")
    if weights is not None and len(weights) != len(sizes):
        raise ConfigError(
            f"weights has {len(weights)} entries for {len(sizes)} datasets; give one weight per dataset"
        )
    probs = sampling_probabilities(list(sizes) if weights is None else weights, temperature)
    if virtual_size is None:
        vsize = default_virtual_size(sizes, probs, max_scale_up)
    elif isinstance(virtual_size, bool) or not isinstance(virtual_size, int) or virtual_size <= 0:
        raise ConfigError(f"virtual_size must be a positive int or None, got {virtual_size!r}")
    else:
        vsize = virtual_size
    counts = sample_counts(probs, vsize, epoch_rng(seed, epoch))
    return MixPlan(tuple(names), tuple(sizes), tuple(probs), vsize, tuple(counts), epoch)


def split_for_slot(count: int, slot: int, total_slots: int, epoch: int = 0) -> int:
    """One slot's share of a count: an even split; the remainder rotates over slots with the epoch.

    Even shares keep every data-parallel rank at the same number of samples (ranks that run out early
    would hang a collective), and rotating the remainder keeps the shares fair over epochs.
    """
    base, rest = divmod(count, total_slots)
    return base + (1 if (slot - epoch) % total_slots < rest else 0)
