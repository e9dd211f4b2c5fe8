"""The arithmetic of weighted mixing (seed 003): ratios, temperature, virtual size, counts."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pytest

from shardcache.errors import ConfigError
from shardcache.mix.plan import (
    default_virtual_size,
    epoch_rng,
    plan_mix,
    sample_counts,
    sampling_probabilities,
    split_for_slot,
)


def reference_counts(
    sizes: list[int],
    weights: list[float] | None,
    temperature: float,
    max_scale_up: float,
    seed: int,
    epoch: int,
) -> tuple[int, list[int]]:
    """The seed's formulas written out longhand, to compare against."""
    w: Sequence[float] = sizes if weights is None else weights
    ratios = [x / sum(w) for x in w]
    scaled = [r ** (1 / temperature) for r in ratios]
    p = [s / sum(scaled) for s in scaled]
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    unscaled = sum(pi / p[largest] * sizes[largest] for pi in p)
    vsize = int(min(unscaled, sum(sizes) * max_scale_up))
    floors = [int(vsize * pi) for pi in p]
    return vsize, floors


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0, 100.0])
@pytest.mark.parametrize("sizes", [[1000, 100], [500, 300, 20], [7, 7, 7], [12345, 10, 999, 1]])
def test_counts_match_the_seed_formulas(sizes: list[int], temperature: float) -> None:
    plan = plan_mix([f"d{i}" for i in range(len(sizes))], sizes, temperature=temperature, seed=3, epoch=1)
    vsize, floors = reference_counts(sizes, None, temperature, 1.5, 3, 1)
    assert plan.virtual_size == vsize
    assert sum(plan.counts) == vsize
    # the remainder adds at most one per drawn position on top of the floors
    assert all(c >= f for c, f in zip(plan.counts, floors, strict=True))
    assert sum(c - f for c, f in zip(plan.counts, floors, strict=True)) == vsize - sum(floors)


def test_temperature_one_keeps_size_ratios() -> None:
    assert sampling_probabilities([300, 100]) == pytest.approx([0.75, 0.25])


def test_temperature_flattens_ratios() -> None:
    p = sampling_probabilities([900, 100], temperature=2.0)
    assert p == pytest.approx([0.75, 0.25])
    assert sampling_probabilities([900, 100], temperature=1e9) == pytest.approx([0.5, 0.5])


def test_largest_keeps_its_size_and_others_are_upsampled() -> None:
    plan = plan_mix(["big", "small"], [900, 100], temperature=2.0, max_scale_up=10.0)
    assert plan.virtual_size in (1199, 1200)  # p_small / p_big = (1/9) ** 0.5 = 1/3: 900 + 300
    assert abs(plan.counts[0] - 900) <= 1
    assert plan.counts[1] >= 299


def test_virtual_size_is_capped_by_max_scale_up() -> None:
    sizes, probs = [100, 100, 100], [1 / 3] * 3
    assert default_virtual_size(sizes, probs, max_scale_up=1.5) == 300
    probs = sampling_probabilities([100, 1, 1], temperature=1e6)
    assert default_virtual_size([100, 1, 1], probs, max_scale_up=1.5) == math.floor(102 * 1.5)


def test_explicit_weights_set_the_ratios() -> None:
    plan = plan_mix(["a", "b"], [100, 100], weights=[3, 1], virtual_size=400)
    assert plan.counts == (300, 100)


def test_remainder_is_assigned_by_the_epoch_rng() -> None:
    probs = [1 / 3, 1 / 3, 1 / 3]
    first = sample_counts(probs, 1000, epoch_rng(7, 0))
    assert first == sample_counts(probs, 1000, epoch_rng(7, 0))
    assert sum(first) == 1000 and sorted(first) == [333, 333, 334]


def test_same_seed_and_epoch_give_the_same_plan_and_epochs_differ() -> None:
    sizes = [1001, 37, 512]
    plans = {e: plan_mix(["a", "b", "c"], sizes, temperature=3.0, seed=11, epoch=e).counts for e in range(8)}
    assert plans[3] == plan_mix(["a", "b", "c"], sizes, temperature=3.0, seed=11, epoch=3).counts
    assert len(set(plans.values())) > 1


def test_virtual_size_below_real_size_warns(caplog: pytest.LogCaptureFixture) -> None:
    plan = plan_mix(["a", "b"], [100, 100], virtual_size=50)
    with caplog.at_level(logging.INFO, logger="shardcache.mix.plan"):
        plan.log()
    assert "virtual data size (50) is less than real data size (200)" in caplog.text
    assert "raw sizes {'a': 100, 'b': 100}" in caplog.text
    assert "resampled sizes" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"weights": [1.0, -1.0]}, "weights must be > 0"),
        ({"weights": [1.0]}, "per dataset"),
        ({"virtual_size": 0}, "virtual_size"),
        ({"max_scale_up": 0.0}, "max_scale_up"),
    ],
)
def test_bad_arguments_raise_config_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_mix(["a", "b"], [10, 20], **kwargs)  # type: ignore[arg-type]


def test_empty_source_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match="'empty' has no samples"):
        plan_mix(["full", "empty"], [10, 0])


@pytest.mark.parametrize("total_slots", [1, 2, 3, 8])
def test_slot_shares_add_up_and_differ_by_at_most_one(total_slots: int) -> None:
    for epoch in range(3):
        shares = [split_for_slot(101, s, total_slots, epoch) for s in range(total_slots)]
        assert sum(shares) == 101
        assert max(shares) - min(shares) <= 1
