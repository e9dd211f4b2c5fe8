"""mvp-dataset 0.2.3 parity: split, sample, Lance filter, consume and snapshot(fingerprint_provider).

Derived from the semantics its docs and tests describe: splits are disjoint, cover the source, follow
source order and normalise their fractions; Lance subsets are row-exact, parquet ones whole row groups and
tar/jsonl ones whole shards; sample is reproducible from its seed, without replacement, and keeps its
members across resampled rounds; filter lists are OR-ed, repeated filters AND-ed; consume stops when
push returns False.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import assert_resumes, make_tars, slot_contexts
from shardcache import ConfigError, Dataset, RuntimeContext
from shardcache.sources.deal.subset import select


class Files:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tars = make_tars(root / "tars", count=10, samples=3)
        self.jsonl = []
        for f in range(10):
            path = root / f"part_{f}.jsonl"
            path.write_text("".join(json.dumps({"id": f * 100 + i}) + "\n" for i in range(4)))
            self.jsonl.append(str(path))
        self.parquet = []
        for f in range(2):
            path = root / f"train_{f}.parquet"
            pq.write_table(pa.table({"id": [f * 100 + i for i in range(20)]}), path, row_group_size=4)
            self.parquet.append(str(path))
        import lance

        self.lance = str(root / "rows.lance")
        rows = pa.table({"id": list(range(50)), "score": [i / 50 for i in range(50)]})
        lance.write_dataset(rows, self.lance, max_rows_per_file=12)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("parity"))


def source(files: Files, kind: str, **options: Any) -> Dataset:
    shards = {"tars": files.tars, "jsonl": files.jsonl, "parquet": files.parquet, "lance": files.lance}[kind]
    if kind != "lance":
        options["daemon"] = None
    return Dataset.from_source(kind, shards, **options)


def ids(dataset: Dataset, context: RuntimeContext | None = None) -> list[Any]:
    return [s.get("id", s.get("__key__")) for s in dataset.iter_context(context or RuntimeContext(seed=0))]


KINDS = ["tars", "jsonl", "parquet", "lance"]


@pytest.mark.parametrize("kind", KINDS)
def test_split_parts_are_disjoint_and_cover_the_source(files: Files, kind: str) -> None:
    parts = source(files, kind).split([0.6, 0.4])
    seen = [ids(p) for p in parts]
    assert all(seen)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1], key=str) == sorted(ids(source(files, kind)), key=str)


@pytest.mark.parametrize("kind", KINDS)
def test_split_fractions_are_normalised(files: Files, kind: str) -> None:
    assert [ids(p) for p in source(files, kind).split([8, 2])] == [
        ids(p) for p in source(files, kind).split([0.8, 0.2])
    ]


def test_split_into_three_parts_follows_source_order(files: Files) -> None:
    parts = source(files, "lance").split([0.5, 0.3, 0.2])
    assert [ids(p) for p in parts] == [list(range(25)), list(range(25, 40)), list(range(40, 50))]


def test_lance_split_is_row_exact(files: Files) -> None:
    train, val = source(files, "lance").split([0.8, 0.2])
    assert (len(ids(train)), len(ids(val))) == (40, 10)


def test_lance_sample_keeps_exactly_round_fraction_rows(files: Files) -> None:
    assert len(ids(source(files, "lance").sample(0.3, seed=1))) == 15


def test_parquet_split_keeps_whole_row_groups(files: Files) -> None:
    train, _ = source(files, "parquet").split([0.5, 0.5])
    groups = Counter(i // 4 + (i // 100) * 100 for i in ids(train))  # row groups of 4 rows
    assert set(groups.values()) == {4}


@pytest.mark.parametrize("kind", ["tars", "jsonl"])
def test_shard_level_subset_reads_whole_shards(files: Files, kind: str) -> None:
    sampled = source(files, kind).sample(0.3, seed=5)
    assert len(sampled.source.shards) == 3
    assert len(ids(sampled)) == 3 * (3 if kind == "tars" else 4)


@pytest.mark.parametrize("kind", KINDS)
def test_sample_is_reproducible_from_its_seed(files: Files, kind: str) -> None:
    first, again = (ids(source(files, kind).sample(0.5, seed=7)) for _ in range(2))
    assert first == again
    assert ids(source(files, kind).sample(0.5, seed=8)) != first


def test_sample_membership_ignores_the_shuffle_seed(files: Files) -> None:
    def members(seed: int) -> set[Any]:
        ds = source(files, "lance", shuffle_mode="global").sample(0.2, seed=3)
        return set(ids(ds, RuntimeContext(seed=seed)))

    assert members(1) == members(2)


@pytest.mark.parametrize("fraction", [0, 1.5, -0.1])
def test_sample_refuses_fractions_outside_zero_one(files: Files, fraction: float) -> None:
    with pytest.raises(ConfigError, match="expected a number in \\(0, 1\\]"):
        source(files, "lance").sample(fraction)


@pytest.mark.parametrize("fractions", [[], [0.5, 0], [1, -1], [float("nan")]])
def test_split_refuses_bad_fractions(files: Files, fractions: list[float]) -> None:
    with pytest.raises(ConfigError, match="fractions"):
        source(files, "lance").split(fractions)


def test_a_mix_cannot_be_split(files: Files) -> None:
    mixed = Dataset.mix({"a": source(files, "tars"), "b": source(files, "jsonl")}, seed=1)
    with pytest.raises(ConfigError, match="mixed dataset cannot be split"):
        mixed.split([0.5, 0.5])


def test_resampled_sample_keeps_its_members_in_every_round(files: Files) -> None:
    ds = source(files, "lance", shuffle_mode="global", resample=True).sample(0.2, seed=2)
    it = ds.iter_context(RuntimeContext(seed=0))
    rounds = [sorted(next(it)["id"] for _ in range(10)) for _ in range(3)]
    assert rounds[0] == rounds[1] == rounds[2]


def test_lance_sample_over_slots_is_the_single_process_subset(files: Files) -> None:
    ds = source(files, "lance", shuffle_mode="global").sample(0.4, seed=4)
    union = [i for ctx in slot_contexts(3) for i in ids(ds, ctx)]
    assert sorted(union) == sorted(ids(ds))
    assert len(union) == 20


def test_subset_is_part_of_the_fingerprint(files: Files) -> None:
    base = source(files, "parquet")
    a, b = base.split([0.5, 0.5])
    assert len({base.fingerprint(), a.fingerprint(), b.fingerprint()}) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_part_resumes_exactly(files: Files, kind: str) -> None:
    assert_resumes(lambda: source(files, kind).split([0.7, 0.3])[0], [0, 1, 5, 10_000])


def test_select_is_row_exact_for_unit_weights() -> None:
    assert select([1] * 10, (("split", (0.8, 0.2), 0),)).tolist() == list(range(8))


def test_stacked_steps_apply_to_what_the_previous_kept() -> None:
    kept = select([1] * 100, (("split", (0.5, 0.5), 1), ("sample", 0.1, 0)))
    assert len(kept) == 5 and all(50 <= k < 100 for k in kept)


# -- Lance filter ----------------------------------------------------------------------------------------


def test_filter_keeps_the_matching_rows_in_source_order(files: Files) -> None:
    assert ids(source(files, "lance").filter("id >= 45")) == [45, 46, 47, 48, 49]


def test_a_predicate_list_is_ored_and_deduplicated(files: Files) -> None:
    ds = source(files, "lance").filter(["id < 3", "id IN (1, 2, 30)"])
    assert ids(ds) == [0, 1, 2, 30]


def test_repeated_filters_are_anded(files: Files) -> None:
    ds = source(files, "lance").filter(["id < 10", "id > 40"]).filter("id % 2 = 0")
    assert ids(ds) == [0, 2, 4, 6, 8, 42, 44, 46, 48]


def test_split_of_a_filter_splits_the_filtered_rows(files: Files) -> None:
    train, val = source(files, "lance").filter("id >= 40").split([0.8, 0.2])
    assert (ids(train), ids(val)) == (list(range(40, 48)), [48, 49])


def test_filtered_global_shuffle_over_slots_reads_each_match_once(files: Files) -> None:
    ds = source(files, "lance", shuffle_mode="global").filter("score < 0.5")
    assert sorted(i for ctx in slot_contexts(4) for i in ids(ds, ctx)) == list(range(25))


def test_filter_after_a_deletion_reads_the_right_rows(tmp_path: Path) -> None:
    import lance

    uri = str(tmp_path / "d.lance")
    lance.write_dataset(pa.table({"id": list(range(20))}), uri, max_rows_per_file=7)
    lance.dataset(uri).delete("id = 3")
    ds = Dataset.from_source("lance", uri).filter("id < 6")
    assert ids(ds) == [0, 1, 2, 4, 5]


def test_filter_takes_mvps_empty_index_argument(files: Files) -> None:
    assert ids(source(files, "lance").filter("id < 2", index={})) == [0, 1]
    with pytest.raises(ConfigError, match="no index options are supported"):
        source(files, "lance").filter("id < 2", index={"cache": True})


def test_filter_on_other_sources_is_refused(files: Files) -> None:
    with pytest.raises(ConfigError, match="only the lance source filters rows"):
        source(files, "parquet").filter("id > 1")


def test_filter_after_a_split_is_refused(files: Files) -> None:
    with pytest.raises(ConfigError, match="before stages, split\\(\\) and sample\\(\\)"):
        source(files, "lance").sample(0.5).filter("id > 1")


def test_a_filtered_dataset_resumes_exactly(files: Files) -> None:
    assert_resumes(
        lambda: source(files, "lance", shuffle_mode="global", batch_size=3).filter("id % 3 = 0"),
        [0, 1, 4, 10_000],
    )


# -- consume ---------------------------------------------------------------------------------------------


class Collect:
    def __init__(self, context: RuntimeContext, stop_after: int | None = None) -> None:
        self.context = context
        self.items: list[Any] = []
        self.stop_after = stop_after

    def push(self, item: Any) -> bool | None:
        self.items.append(item["id"])
        return None if self.stop_after is None else len(self.items) < self.stop_after

    def finish(self) -> tuple[int, list[Any]]:
        return self.context.slot, self.items


def test_consume_returns_finish_after_every_output(files: Files) -> None:
    ds = source(files, "lance", context=RuntimeContext(rank=1, world_size=2))
    slot, items = ds.consume(Collect)
    assert (slot, items) == (1, list(range(25, 50)))


def test_consume_stops_when_push_returns_false(files: Files) -> None:
    _, items = source(files, "lance").consume(lambda ctx: Collect(ctx, stop_after=4))
    assert items == [0, 1, 2, 3]


class Failing(Collect):
    finished = False

    def push(self, item: Any) -> bool | None:
        raise RuntimeError("consumer failed")

    def finish(self) -> tuple[int, list[Any]]:
        Failing.finished = True
        return super().finish()


def test_a_failing_push_propagates_without_finish(files: Files) -> None:
    with pytest.raises(RuntimeError, match="consumer failed"):
        source(files, "lance").consume(Failing)
    assert not Failing.finished


# -- snapshot --------------------------------------------------------------------------------------------


def plus_one(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "id": sample["id"] + 1}


def test_snapshot_without_provider_holds_the_rows_of_cache_in_its_own_entry(
    files: Files, tmp_path: Path
) -> None:
    snap = source(files, "jsonl").map(plus_one).snapshot(cache_dir=str(tmp_path))
    cached = source(files, "jsonl").map(plus_one).cache(cache_dir=str(tmp_path))
    # Another entry: snapshot() stores the row metadata under mvp's names, .cache() as written.
    assert snap.fingerprint() != cached.fingerprint()
    assert sorted(ids(snap)) == sorted(ids(cached))


def test_snapshot_provider_names_the_entry_whatever_the_upstream(files: Files, tmp_path: Path) -> None:
    first = source(files, "jsonl").map(plus_one).snapshot(lambda: "v1", cache_dir=str(tmp_path))
    built = sorted(ids(first))
    # Another upstream under the same name reuses the entry: the provider declared them equivalent.
    other = source(files, "jsonl").map(lambda s: s).snapshot(lambda: "v1", cache_dir=str(tmp_path))
    assert sorted(ids(other)) == built
    renamed = source(files, "jsonl").map(lambda s: s).snapshot(lambda: "v2", cache_dir=str(tmp_path))
    assert sorted(ids(renamed)) == sorted(ids(source(files, "jsonl")))


def test_snapshot_provider_must_return_a_non_empty_string(files: Files, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must return a non-empty string"):  # checked at snapshot()
        source(files, "jsonl").snapshot(lambda: "", cache_dir=str(tmp_path))


def provider_v1() -> str:
    return "v1"


def test_snapshot_fingerprint_is_stable_across_instances(files: Files, tmp_path: Path) -> None:
    def make() -> Dataset:
        return source(files, "jsonl").snapshot(provider_v1, cache_dir=str(tmp_path))

    assert make().fingerprint() == make().fingerprint()
