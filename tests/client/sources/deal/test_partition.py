"""The partitioning layer on its own (`sources.deal.partition`): who reads which samples in an epoch.

Pure functions, no I/O: every property below is checked over generated unit counts and layouts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcache.sources.deal.partition import (
    Layout,
    Partitioning,
    Piece,
    node_members,
    owners,
    plan_epoch,
)

Sample = tuple[int, int]  # (unit, index within the unit)


def plan(
    counts: Sequence[int],
    layout: Layout,
    placement: str = "node",
    even: str | None = None,
    exchange: float = 0.0,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[Piece]]:
    universe = [Piece(i, 0, c) for i, c in enumerate(counts)]
    weights = tuple(float(max(1, c)) for c in counts)
    return plan_epoch(universe, weights, layout, Partitioning(placement, even, exchange), seed, epoch)


def samples(pieces: Sequence[Piece], pad: bool | None = None) -> list[Sample]:
    """The samples `pieces` read, in order (only the pad or non-pad ones when `pad` is given)."""
    return [
        (p.unit, i)
        for p in pieces
        if pad is None or p.pad == pad
        for i in range(p.start, p.stop if p.stop is not None else p.start)
    ]


def per_rank(slots: list[list[Piece]], layout: Layout) -> list[list[Piece]]:
    return [
        [p for slot in slots[r * layout.workers : (r + 1) * layout.workers] for p in slot]
        for r in range(layout.ranks)
    ]


def everything(counts: Sequence[int]) -> Counter[Sample]:
    return Counter((u, i) for u, c in enumerate(counts) for i in range(c))


def moved_fraction(placement: str, exchange: float) -> float:
    return exchange if placement == "node" else 0.0  # exchange moves units between nodes only


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    groups = draw(st.integers(1, 4))
    return Layout(groups, groups * draw(st.integers(1, 3)), draw(st.integers(1, 3)))


# Unequal units, some of them empty: the cut must still be exact.
unit_counts = st.lists(st.integers(0, 17), min_size=1, max_size=40)
PLACEMENTS = ("global", "node")
# Node placement may move a fraction of the units to other nodes for one epoch; exactness must not change.
exchanges = st.sampled_from([0.0, 0.1, 0.5])


@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=60, deadline=None)
@given(counts=unit_counts, layout=layouts(), epoch=st.integers(0, 3), exchange=exchanges)
def test_without_even_every_sample_is_read_exactly_once(
    placement: str, counts: list[int], layout: Layout, epoch: int, exchange: float
) -> None:
    slots = plan(counts, layout, placement, None, exchange=moved_fraction(placement, exchange), epoch=epoch)
    assert len(slots) == layout.total_slots
    read = Counter(s for slot in slots for s in samples(slot))
    assert read == everything(counts)
    assert not any(p.pad for slot in slots for p in slot)


@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=60, deadline=None)
@given(counts=unit_counts, layout=layouts(), epoch=st.integers(0, 3), exchange=exchanges)
def test_drop_gives_every_rank_the_same_count_and_drops_fewer_than_the_ranks(
    placement: str, counts: list[int], layout: Layout, epoch: int, exchange: float
) -> None:
    slots = plan(counts, layout, placement, "drop", moved_fraction(placement, exchange), epoch=epoch)
    ranks = per_rank(slots, layout)
    sizes = {len(samples(r)) for r in ranks}
    assert sizes == {sum(counts) // layout.ranks}
    read = Counter(s for slot in slots for s in samples(slot))
    assert max(read.values(), default=1) == 1  # nothing twice
    assert set(read) <= set(everything(counts))
    assert sum(counts) - len(read) < layout.ranks
    assert not any(p.pad for slot in slots for p in slot)


@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=60, deadline=None)
@given(counts=unit_counts, layout=layouts(), epoch=st.integers(0, 3), exchange=exchanges)
def test_pad_gives_every_rank_the_same_count_and_marks_fewer_repeats_than_the_ranks(
    placement: str, counts: list[int], layout: Layout, epoch: int, exchange: float
) -> None:
    total = sum(counts)
    slots = plan(counts, layout, placement, "pad", moved_fraction(placement, exchange), epoch=epoch)
    ranks = per_rank(slots, layout)
    assert {len(samples(r)) for r in ranks} == {-(-total // layout.ranks)}
    originals = Counter(s for slot in slots for s in samples(slot, pad=False))
    assert originals == everything(counts)  # every sample once, unmarked
    repeats = [s for slot in slots for s in samples(slot, pad=True)]
    assert len(repeats) < layout.ranks
    assert set(repeats) <= set(originals)  # a repeat is a real sample, marked


@pytest.mark.parametrize("even", ["drop", "pad"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@settings(max_examples=40, deadline=None)
@given(counts=unit_counts, layout=layouts(), epoch=st.integers(0, 3), exchange=exchanges)
def test_even_gives_every_rank_the_same_worker_split(
    placement: str, even: str, counts: list[int], layout: Layout, epoch: int, exchange: float
) -> None:
    slots = plan(counts, layout, placement, even, moved_fraction(placement, exchange), epoch=epoch)
    splits = {
        tuple(len(samples(slots[r * layout.workers + w])) for w in range(layout.workers))
        for r in range(layout.ranks)
    }
    assert len(splits) == 1  # hence the same number of worker-side batches on every rank, whatever size
    (split,) = splits
    assert max(split) - min(split) <= 1


def test_node_placement_keeps_each_nodes_units_across_epochs_and_reshuffles_within() -> None:
    counts = [5 + (u * 7) % 11 for u in range(60)]
    layout = Layout(groups=3, ranks=6, workers=2)
    per_group = layout.slots_per_group
    home = node_members(tuple(float(c) for c in counts), 3, 0)
    orders = []
    for epoch in range(4):
        slots = plan(counts, layout, "node", None, epoch=epoch)
        groups = [slots[g * per_group : (g + 1) * per_group] for g in range(3)]
        for g, group in enumerate(groups):
            assert {p.unit for slot in group for p in slot} == set(home[g])
        orders.append([[p.unit for p in slot] for slot in slots])
    assert all(a != b for a, b in zip(orders, orders[1:], strict=False))
    # Not just the order within one slot: units change slots (and ranks) inside the node.
    assert orders[0][0] != orders[1][0] and set(orders[0][0]) != set(orders[1][0])


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 300), groups=st.integers(1, 24), seed=st.integers(0, 5))
def test_node_shares_of_equal_units_differ_by_at_most_one(n: int, groups: int, seed: int) -> None:
    members = node_members((1.0,) * n, groups, seed)
    assert len(members) == groups
    assert sorted(u for m in members for u in m) == list(range(n))
    sizes = [len(m) for m in members]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(data=st.data(), groups=st.integers(1, 12), seed=st.integers(0, 3))
def test_node_shares_of_weighted_units_are_balanced_within_two_of_the_heaviest_unit(
    data: st.DataObject, groups: int, seed: int
) -> None:
    # A consistent assignment (units only ever move to an added group) cannot always cut weighted units
    # to within one unit of the mean; two of the heaviest unit is what it guarantees in practice.
    weights = data.draw(st.lists(st.integers(1, 50), min_size=4 * groups, max_size=200))
    members = node_members(tuple(float(w) for w in weights), groups, seed)
    assert sorted(u for m in members for u in m) == list(range(len(weights)))
    loads = [sum(weights[u] for u in m) for m in members]
    mean = sum(weights) / groups
    assert max(abs(load - mean) for load in loads) <= 2 * max(weights)


def moved(a: list[int], b: list[int]) -> float:
    return sum(x != y for x, y in zip(a, b, strict=True)) / len(a)


@pytest.mark.parametrize(("before", "after", "expected"), [(4, 5, 1 / 5), (4, 8, 4 / 8), (4, 3, 1 / 4)])
def test_changing_the_number_of_nodes_moves_only_the_changed_nodes_share(
    before: int, after: int, expected: float
) -> None:
    n = 2000
    weights = (1.0,) * n
    old, new = owners(weights, before, 7), owners(weights, after, 7)
    assert moved(old, new) == pytest.approx(expected, abs=2 / n)
    # Units move only to an added node (or away from a removed one), never between the nodes that stay.
    stay = min(before, after)
    assert all(o == w for o, w in zip(old, new, strict=True) if o < stay and w < stay)


def test_changing_the_number_of_weighted_nodes_moves_about_the_new_nodes_share() -> None:
    weights = tuple(float(1 + (u * 37) % 90) for u in range(3000))
    total = sum(weights)
    for before in (4, 16):
        old, new = owners(weights, before, 1), owners(weights, before + 1, 1)
        share = sum(w for w, o, x in zip(weights, old, new, strict=True) if o != x) / total
        assert share == pytest.approx(1 / (before + 1), abs=0.01)
        assert all(x == before for o, x in zip(old, new, strict=True) if o != x)


def test_exchange_moves_about_that_fraction_of_the_units_each_epoch() -> None:
    counts = [10] * 2000
    layout = Layout(groups=4, ranks=8, workers=1)
    home = owners(tuple(float(c) for c in counts), 4, 0)
    away_by_epoch = []
    for epoch in range(3):
        slots = plan(counts, layout, "node", None, exchange=0.1, epoch=epoch)
        where = {p.unit: s // layout.slots_per_group for s, slot in enumerate(slots) for p in slot}
        away = {u for u, g in where.items() if g != home[u]}
        assert 0.08 <= len(away) / len(counts) <= 0.12
        away_by_epoch.append(away)
        assert Counter(s for slot in slots for s in samples(slot)) == everything(counts)
    assert len(away_by_epoch[0] & away_by_epoch[1]) < 0.3 * len(away_by_epoch[0])  # drawn per epoch
