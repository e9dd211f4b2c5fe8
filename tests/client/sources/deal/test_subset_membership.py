"""Subset membership is mvp-dataset 0.2.3's: the same split()/sample() arguments keep the same members.

The expected members are worked out by hand from mvp-dataset's rules (in `shardcache.sources.deal.subset`):

- unit sources (tars and jsonl shards, parquet row groups weighted by rows): part k ends at the weight bound
  (f_0 + ... + f_k) * W; a unit opens the next part once the weight before it reaches the bound. A sample
  ranks units by sha256("{seed}:{index}") and takes them while the weight taken is under fraction * W.
- lance rows: part k is rows [round(c_k * n), round(c_{k+1} * n)) (round half to even); a sample keeps the
  images of positions 0 .. round(fraction * n) - 1 under a seeded Feistel permutation of [0, n).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import make_tars
from shardcache import Dataset, RuntimeContext
from shardcache.sources.deal.feistel import permute_positions
from shardcache.sources.deal.subset import normalize_fractions, select, select_rows


class Five:
    """Five of each unit: 5 tar shards, 5 jsonl files, 5 parquet row groups, 5 lance rows (and 50)."""

    def __init__(self, root: Path) -> None:
        self.tars = make_tars(root / "tars", count=5, samples=2)
        self.jsonl = []
        for f in range(5):
            path = root / f"part_{f}.jsonl"
            path.write_text("".join(json.dumps({"id": f * 100 + i}) + "\n" for i in range(3)))
            self.jsonl.append(str(path))
        self.parquet = [str(root / "groups.parquet")]
        pq.write_table(pa.table({"id": list(range(10))}), self.parquet[0], row_group_size=2)
        import lance

        self.lance5 = str(root / "five.lance")
        lance.write_dataset(pa.table({"id": list(range(5))}), self.lance5)
        self.lance50 = str(root / "fifty.lance")
        lance.write_dataset(pa.table({"id": list(range(50))}), self.lance50, max_rows_per_file=12)


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory) -> Five:
    return Five(tmp_path_factory.mktemp("membership"))


def units_read(five: Five, kind: str, dataset: Dataset) -> list[int]:
    """The unit (shard, row group or row) each sample came from, deduplicated, ascending."""
    found: set[int] = set()
    for sample in dataset.iter_context(RuntimeContext(seed=0)):
        if kind == "tars":
            found.add(int(sample["__key__"][1:4]))
        elif kind == "jsonl":
            found.add(sample["id"] // 100)
        elif kind == "parquet":
            found.add(sample["id"] // 2)
        else:
            found.add(sample["id"])
    return sorted(found)


def source(five: Five, kind: str) -> Dataset:
    if kind == "lance":
        return Dataset.from_source("lance", five.lance5)
    shards = {"tars": five.tars, "jsonl": five.jsonl, "parquet": five.parquet}[kind]
    return Dataset.from_source(kind, shards, daemon=None)


UNIT_KINDS = ["tars", "jsonl", "parquet"]


@pytest.mark.parametrize("kind", UNIT_KINDS)
def test_halves_of_five_units_are_three_and_two(five: Five, kind: str) -> None:
    # The bound 2.5 is reached only once three units are dealt.
    parts = source(five, kind).split([0.5, 0.5])
    assert [units_read(five, kind, p) for p in parts] == [[0, 1, 2], [3, 4]]


@pytest.mark.parametrize("kind", UNIT_KINDS)
def test_thirds_of_five_units_are_two_two_one(five: Five, kind: str) -> None:
    # Bounds 5/3 and 10/3: units 0-1 before the first, 2-3 before the second, 4 after.
    parts = source(five, kind).split([1, 1, 1])
    assert [units_read(five, kind, p) for p in parts] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("kind", UNIT_KINDS)
def test_sample_of_five_units_takes_the_first_by_seeded_hash(five: Five, kind: str) -> None:
    ranked = sorted(range(5), key=lambda i: hashlib.sha256(f"0:{i}".encode()).digest())
    assert ranked[:2] == [4, 3]  # the target 0.4 * 5 = 2 units
    assert units_read(five, kind, source(five, kind).sample(0.4, seed=0)) == [3, 4]


def test_halves_of_five_lance_rows_round_half_to_even(five: Five) -> None:
    # Row-exact: the cut is round(2.5) = 2, unlike the unit rule's 3/2 (as in mvp-dataset).
    parts = source(five, "lance").split([0.5, 0.5])
    assert [units_read(five, "lance", p) for p in parts] == [[0, 1], [2, 3, 4]]


def test_lance_sample_keeps_mvps_rows(five: Five) -> None:
    ds = Dataset.from_source("lance", five.lance50).sample(0.1, seed=0)
    assert units_read(five, "lance", ds) == [9, 22, 24, 31, 42]
    assert units_read(five, "lance", ds) == sorted(reference_permute(i, 50, 0) for i in range(5))


def test_lance_sample_under_global_shuffle_keeps_the_same_rows(five: Five) -> None:
    ds = Dataset.from_source("lance", five.lance50, shuffle_mode="global").sample(0.1, seed=0)
    assert units_read(five, "lance", ds) == [9, 22, 24, 31, 42]


def lance_ids(ds: Dataset, **ctx: Any) -> list[int]:
    return sorted(int(s["id"]) for s in ds.iter_context(RuntimeContext(**ctx)))


def test_lance_split_under_global_shuffle_follows_the_context_seed(five: Five) -> None:
    ds = Dataset.from_source("lance", five.lance50, shuffle_mode="global")
    seed7, seed13 = lance_ids(ds.split([0.8, 0.2])[0], seed=7), lance_ids(ds.split([0.8, 0.2])[0], seed=13)
    assert len(seed7) == len(seed13) == 40
    assert seed7 != seed13


def test_lance_split_under_global_shuffle_keeps_disjoint_parts_in_every_epoch_and_round(five: Five) -> None:
    ds = Dataset.from_source("lance", five.lance50, shuffle_mode="global", resample=True)
    train, val = ds.split([4, 1])

    def first_ids(ds: Dataset, count: int, **ctx: Any) -> list[int]:
        return [int(s["id"]) for s in itertools.islice(ds.iter_context(RuntimeContext(**ctx)), count)]

    kept = sorted(first_ids(train, 40, seed=3))  # resample=True: a round is the part's 40 rows
    rounds = first_ids(train, 120, seed=3, epoch=2)  # three rounds of another epoch: the same 40 rows
    assert kept == sorted(rounds[:40]) == sorted(rounds[40:80]) == sorted(rounds[80:])
    assert set(kept).isdisjoint(first_ids(val, 30, seed=3, epoch=1))


def test_lance_split_without_shuffle_is_a_source_order_window_whatever_the_seed(five: Five) -> None:
    first, _ = Dataset.from_source("lance", five.lance50).split([0.8, 0.2])
    assert lance_ids(first, seed=7) == lance_ids(first, seed=13) == list(range(40))


def test_nested_lance_subsets_still_stack(five: Five) -> None:
    # A shardcache extension (mvp-dataset refuses a second Lance step): sample the rows of the first part.
    first, _ = Dataset.from_source("lance", five.lance50).split([0.6, 0.4])
    kept = units_read(five, "lance", first.sample(0.5, seed=1))
    assert kept == sorted(reference_permute(i, 30, 1) for i in range(15))


# -- the rules as properties ------------------------------------------------------------------------------

_MASK = (1 << 64) - 1


def _splitmix_finish(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def reference_permute(position: int, total: int, seed: int) -> int:
    """One position at a time, in plain integers: the permutation `permute_positions` vectorises."""
    if total == 1:
        return 0
    bits = max(2, (total - 1).bit_length())
    high_bits, low_bits = bits // 2, bits - bits // 2
    value = position
    while True:
        high, low = value >> low_bits, value & ((1 << low_bits) - 1)
        for r in range(8):
            key = seed ^ ((r + 1) * 0x9E3779B97F4A7C15)
            if r % 2 == 0:
                low ^= _splitmix_finish((high ^ key) & _MASK) & ((1 << low_bits) - 1)
            else:
                high ^= _splitmix_finish((low ^ key) & _MASK) & ((1 << high_bits) - 1)
        value = (high << low_bits) | low
        if value < total:
            return value


@pytest.mark.parametrize("total", [1, 2, 3, 5, 17, 64, 1000])
@pytest.mark.parametrize("seed", [0, 1, -5, 2**40 + 7])
def test_permutation_is_a_bijection_matching_the_scalar_rule(total: int, seed: int) -> None:
    image = permute_positions(np.arange(total), total, seed).tolist()
    assert sorted(image) == list(range(total))
    assert image == [reference_permute(p, total, seed) for p in range(total)]


def _random_case(rng: random.Random) -> tuple[list[float], tuple[float, ...]]:
    sizes = [float(rng.choice([1, 1, rng.randint(1, 50)])) for _ in range(rng.randint(1, 40))]
    fractions = normalize_fractions(
        [rng.choice([0.1, 0.2, 0.5, 1, 3, rng.random() + 0.01]) for _ in range(4)]
    )
    return sizes, fractions[: rng.randint(1, 4)]


@pytest.mark.parametrize("trial", range(50))
def test_unit_split_parts_are_disjoint_cover_in_order_and_follow_the_bounds(trial: int) -> None:
    rng = random.Random(trial)
    sizes, fractions = _random_case(rng)
    fractions = normalize_fractions(fractions)
    parts = [select(sizes, (("split", fractions, k),)).tolist() for k in range(len(fractions))]
    assert [u for part in parts for u in part] == list(range(len(sizes)))  # disjoint, ordered, complete
    bounds = np.cumsum(fractions)[:-1] * sum(sizes)
    for k, part in enumerate(parts):
        for unit in part:
            before = sum(sizes[:unit])
            assert k == len(fractions) - 1 or before < bounds[k]  # opened before this part's bound
            assert k == 0 or before >= bounds[k - 1]  # and not before the previous one's


@pytest.mark.parametrize("trial", range(50))
def test_row_split_parts_are_the_rounded_cuts(trial: int) -> None:
    rng = random.Random(trial)
    count = rng.randint(0, 500)
    _, fractions = _random_case(rng)
    fractions = normalize_fractions(fractions)
    parts = [select_rows(count, (("split", fractions, k),)).tolist() for k in range(len(fractions))]
    assert [r for part in parts for r in part] == list(range(count))
    cuts = [0, *(round(c * count) for c in np.cumsum(fractions)[:-1]), count]
    assert [len(p) for p in parts] == [b - a for a, b in zip(cuts, cuts[1:], strict=False)]


@pytest.mark.parametrize("trial", range(50))
def test_unit_sample_stops_at_the_first_unit_reaching_the_target(trial: int) -> None:
    rng = random.Random(trial)
    sizes, _ = _random_case(rng)
    fraction, seed = rng.choice([0.1, 0.4, 0.5, 1.0, rng.random() + 1e-6]), rng.randint(-100, 10**9)
    kept = select(sizes, (("sample", fraction, seed),)).tolist()
    assert kept == sorted(set(kept))
    ranked = sorted(range(len(sizes)), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest())
    assert sorted(ranked[: len(kept)]) == kept  # a prefix of the seeded ranking
    taken = sum(sizes[u] for u in kept)
    target = fraction * sum(sizes)
    assert taken >= target or len(kept) == len(sizes)
    assert taken - sizes[ranked[len(kept) - 1]] < target  # the last unit was still needed


@pytest.mark.parametrize("trial", range(30))
def test_row_sample_keeps_exactly_round_fraction_rows(trial: int) -> None:
    rng = random.Random(trial)
    count, fraction, seed = rng.randint(0, 3000), rng.random() + 1e-6, rng.randint(0, 10**6)
    kept = select_rows(count, (("sample", min(fraction, 1.0), seed),)).tolist()
    assert len(kept) == len(set(kept)) == round(min(fraction, 1.0) * count)
    assert all(0 <= r < count for r in kept) and kept == sorted(kept)


def test_stacked_unit_steps_apply_to_what_the_previous_kept() -> None:
    sizes: list[Any] = [1] * 10
    first = select(sizes, (("split", (0.5, 0.5), 1),)).tolist()
    assert first == [5, 6, 7, 8, 9]
    inner = select([1] * 5, (("sample", 0.4, 0),)).tolist()
    assert select(sizes, (("split", (0.5, 0.5), 1), ("sample", 0.4, 0))).tolist() == [first[i] for i in inner]


# -- enough shards for the slots ----------------------------------------------------------------------------


def test_a_shard_subset_with_fewer_shards_than_slots_is_refused(five: Five) -> None:
    ds = Dataset.from_source("jsonl", five.jsonl, context=RuntimeContext(world_size=3))
    with pytest.raises(ValueError, match=r"\[InsufficientSubsetUnits\].* keeps 2 of the 5 shards"):
        ds.split([0.6, 0.4])  # 3 and 2 shards: the second part has fewer than 3 slots


def test_a_shard_sample_with_fewer_shards_than_slots_is_refused(five: Five) -> None:
    ds = Dataset.from_source("tars", five.tars, context=RuntimeContext(world_size=2))
    with pytest.raises(ValueError, match=r"\[InsufficientSubsetUnits\]"):
        ds.sample(0.2, seed=0)  # one shard for two slots


def test_a_shard_subset_with_one_shard_per_slot_is_accepted(five: Five) -> None:
    ds = Dataset.from_source("jsonl", five.jsonl, context=RuntimeContext(world_size=2))
    first, second = ds.split([0.6, 0.4])
    files = [{s["id"] // 100 for s in part.iter_context(RuntimeContext())} for part in (first, second)]
    assert files == [{0, 1, 2}, {3, 4}]
