"""One slot's share is its row of the whole deal: `slot_share(...) == plan_epoch(...)[slot]` for every slot,
with `even=`, `exchange=`, node groups decided by a larger dataset, empty units and every layout tried."""

from __future__ import annotations

import random

import pytest

from shardcache.sources.deal.partition import Layout, Partitioning, Piece, plan_epoch
from shardcache.sources.deal.share import slot_share

LAYOUTS = [Layout(1, 1, 1), Layout(1, 4, 2), Layout(2, 4, 1), Layout(3, 6, 2), Layout(4, 4, 3)]
LAYOUTS += [Layout(2, 8, 4)]
PARTITIONINGS = [
    Partitioning("global", "drop"),
    Partitioning("global", "pad"),
    Partitioning("node", "drop"),
    Partitioning("node", "pad"),
    Partitioning("node", None, 0.3),
    Partitioning("node", "drop", 0.3),
    Partitioning("node", "pad", 0.5),
]


def assert_rows_match(
    counts: list[int],
    layout: Layout,
    part: Partitioning,
    shuffle: bool = True,
    fixed_owner: list[int] | None = None,
) -> None:
    n = len(counts)
    weights = tuple(float(max(1, c)) for c in counts)
    universe = [Piece(u, 0, counts[u] if part.even is not None else None) for u in range(n)]
    for epoch, round_index in ((0, 0), (3, 0), (1, 2)):
        plan = plan_epoch(universe, weights, layout, part, 7, epoch, round_index, shuffle, fixed_owner)
        for slot in range(layout.total_slots):
            mine = slot_share(
                n,
                lambda: weights,
                layout,
                part,
                7,
                epoch,
                round_index,
                slot,
                shuffle,
                lambda: counts,
                fixed_owner,
            )
            assert mine == plan[slot], (epoch, round_index, slot)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("part", PARTITIONINGS, ids=str)
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_slots_share_under_even_and_exchange_is_its_row_of_the_whole_deal(
    layout: Layout, part: Partitioning, shuffle: bool
) -> None:
    rng = random.Random(f"{layout}{part}{shuffle}")
    counts = [rng.randint(1, 40) for _ in range(57)]
    assert_rows_match(counts, layout, part, shuffle)


@pytest.mark.parametrize("part", PARTITIONINGS, ids=str)
def test_units_larger_than_a_slot_are_split_as_the_whole_deal_splits_them(part: Partitioning) -> None:
    # A few huge units over many small slots: one unit straddles several slots' edges.
    assert_rows_match([500, 3, 200, 1, 90], Layout(2, 8, 4), part)


@pytest.mark.parametrize("part", PARTITIONINGS, ids=str)
def test_empty_units_and_fewer_samples_than_readers_match_the_whole_deal(part: Partitioning) -> None:
    assert_rows_match([0, 5, 0, 0, 1, 7, 0], Layout(2, 4, 2), part)
    assert_rows_match([1, 1], Layout(2, 8, 2), part)
    assert_rows_match([], Layout(1, 2, 1), part)


@pytest.mark.parametrize("part", PARTITIONINGS[2:], ids=str)
def test_groups_decided_by_a_larger_dataset_match_the_whole_deal(part: Partitioning) -> None:
    rng = random.Random(3)
    counts = [rng.randint(0, 30) for _ in range(41)]
    owner = [rng.randrange(3) for _ in counts]
    assert_rows_match(counts, Layout(3, 6, 2), part, fixed_owner=owner)
    assert_rows_match(counts, Layout(3, 6, 2), Partitioning("node"), fixed_owner=owner)


@pytest.mark.parametrize("seed", range(20))
def test_random_layouts_and_counts_match_the_whole_deal(seed: int) -> None:
    rng = random.Random(seed)
    groups = rng.randint(1, 4)
    ranks = groups * rng.randint(1, 3)
    layout = Layout(groups, ranks, rng.randint(1, 4))
    part = rng.choice(PARTITIONINGS)
    counts = [rng.choice([0, 1, 2, 5, 17, 60]) for _ in range(rng.randint(0, 80))]
    assert_rows_match(counts, layout, part, shuffle=rng.random() < 0.8)
