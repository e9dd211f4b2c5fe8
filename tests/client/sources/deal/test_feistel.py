"""The Feistel permutation's two evaluations agree: many positions at once go through per-round lookup
tables, a few (a slot's stride) are mixed one by one, and both are the scalar rule that pins every order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardcache.sources.deal.feistel import permute_positions
from tests.client.sources.deal.test_subset_membership import reference_permute

# Sizes just above and at powers of two: the most cycle walking, and both ways of halving the bits.
SIZES = [4, 5, 9, 17, 255, 256, 257, 1023, 1025, 4097, 65536, 65537, 100_003, (1 << 20) + 1]


@pytest.mark.parametrize("total", SIZES)
def test_every_position_at_once_is_a_bijection_that_follows_the_scalar_rule(total: int) -> None:
    rng = random.Random(total)
    seed = rng.getrandbits(64)
    image = permute_positions(np.arange(total), total, seed)
    assert np.array_equal(np.sort(image), np.arange(total))
    for position in rng.sample(range(total), min(total, 200)):
        assert image[position] == reference_permute(position, total, seed)


@pytest.mark.parametrize("total", SIZES)
def test_a_few_positions_map_as_they_do_among_all_positions(total: int) -> None:
    rng = random.Random(-total)
    seed = rng.getrandbits(63) - (1 << 62)  # negative seeds too: a key is the seed's low 64 bits
    whole = permute_positions(np.arange(total), total, seed)
    for count in (1, 3, max(1, total // 1000), max(1, total // 2)):
        positions = np.asarray(rng.sample(range(total), count), dtype=np.int64)
        assert np.array_equal(permute_positions(positions, total, seed), whole[positions])


def test_the_positions_given_are_left_as_they_were() -> None:
    positions = np.arange(1000, dtype=np.int64)
    permute_positions(positions, 1000, seed=3)
    assert np.array_equal(positions, np.arange(1000))
