"""The epoch order (order version 2): a seeded bijection evaluated position by position, its shuffle
quality, one slot's share planned alone equal to the whole deal's, and states of the old order refused."""

from __future__ import annotations

import numpy as np
import pytest

from shardcache.sources.deal.order import order_at, permutation, shuffled
from shardcache.sources.deal.partition import Layout, Partitioning, Piece, plan_epoch
from shardcache.sources.deal.share import slot_share


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 31, 32, 33, 1000, 4097])
def test_the_order_is_a_permutation_of_every_size(n: int) -> None:
    for epoch in range(3):
        assert sorted(permutation(n, 7, epoch)) == list(range(n))


def test_positions_mapped_alone_are_those_of_the_whole_order() -> None:
    n = 10_007
    whole = shuffled(n, 3, 5, 2, ":g1")
    positions = np.array([0, 1, 17, 5000, n - 1])
    assert order_at(positions, n, 3, 5, 2, ":g1").tolist() == whole[positions].tolist()
    assert order_at(np.arange(9, n, 13), n, 3, 5, 2, ":g1").tolist() == whole[9::13].tolist()


def test_the_whole_order_is_read_only_and_the_same_in_every_call() -> None:
    first = shuffled(100, 1, 1)
    assert not first.flags.writeable
    assert permutation(100, 1, 1) == first.tolist()


def test_seeds_epochs_rounds_and_salts_give_different_orders() -> None:
    base = permutation(1000, 0, 0)
    others = [
        permutation(1000, 1, 0),
        permutation(1000, 0, 1),
        permutation(1000, 0, 0, 1),
        permutation(1000, 0, 0, 0, ":g0"),
    ]
    for other in others:
        assert other != base
        # Not a rotation or a small edit of it: most positions differ.
        assert sum(a == b for a, b in zip(base, other, strict=True)) < 20


def test_position_and_unit_are_uncorrelated() -> None:
    n = 20_000
    for epoch in range(5):
        order = shuffled(n, 0, epoch).astype(np.float64)
        r = np.corrcoef(np.arange(n), order)[0, 1]
        assert abs(r) < 0.05  # a uniform permutation's r has a standard deviation of 1/sqrt(n-1) = 0.007


def test_displacements_are_those_of_a_uniform_permutation() -> None:
    # |order[i] - i| has mean n/3 under a uniform permutation; the fraction displaced by at most n/10 is
    # 1 - 0.9**2 = 0.19.
    n = 20_000
    order = shuffled(n, 4, 0)
    displacement = np.abs(order - np.arange(n))
    assert abs(displacement.mean() / n - 1 / 3) < 0.01
    assert abs((displacement <= n // 10).mean() - 0.19) < 0.02


def test_neighbouring_units_are_rarely_read_next_to_each_other() -> None:
    # Units u and u + 1 at adjacent positions: 2 (n - 1) / n ~ 2 such pairs expected in a uniform order.
    n = 20_000
    for epoch in range(5):
        where = np.argsort(shuffled(n, 9, epoch))
        assert int((np.abs(np.diff(where)) == 1).sum()) <= 10


def test_each_slot_gets_every_position_of_its_stride_once_over_many_seeds() -> None:
    # Every unit lands on every slot about equally often across epochs (no unit is stuck to a slot).
    n, slots, epochs = 64, 8, 800
    hits = np.zeros((n, slots), dtype=np.int64)
    for epoch in range(epochs):
        order = shuffled(n, 0, epoch)
        for slot in range(slots):
            hits[order[slot::slots], slot] += 1
    expected = epochs / slots
    assert hits.min() > expected * 0.6 and hits.max() < expected * 1.4


LAYOUTS = [Layout(1, 4, 2), Layout(2, 4, 1), Layout(3, 6, 2), Layout(4, 4, 3)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("placement", ["global", "node"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_one_slots_share_is_its_row_of_the_whole_deal(layout: Layout, placement: str, shuffle: bool) -> None:
    n = 101
    weights = tuple(float(1 + (u * 7) % 5) for u in range(n))
    part = Partitioning(placement)
    universe = [Piece(u) for u in range(n)]
    for epoch, round_index in ((0, 0), (2, 0), (1, 3)):
        plan = plan_epoch(universe, weights, layout, part, 5, epoch, round_index, shuffle=shuffle)
        for slot in range(layout.total_slots):
            mine = slot_share(n, lambda: weights, layout, part, 5, epoch, round_index, slot, shuffle)
            assert mine == plan[slot]


def test_even_without_counts_is_left_to_the_whole_deal() -> None:
    even = Partitioning("node", "drop")
    assert slot_share(10, lambda: (1.0,) * 10, Layout(2, 2, 1), even, 0, 0, 0, 0) is None


def test_a_single_group_never_asks_for_the_weights() -> None:
    def weights() -> tuple[float, ...]:
        raise AssertionError("weights are for node placement only")

    assert slot_share(10, weights, Layout(1, 2, 1), Partitioning("node"), 0, 0, 0, 1) is not None
