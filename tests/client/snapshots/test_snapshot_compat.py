"""mvp-dataset 0.2.3's snapshot()/cache() behaviours (issue 19, gap 8): closures before the boundary,
split()/sample() in the materialised row space, reuse under another topology, one build for many readers,
and the refusals with mvp's error codes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

lance = pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

from shardcache import Dataset, RuntimeContext  # noqa: E402
from shardcache.errors import ConfigError  # noqa: E402
from shardcache.snapshots import cache_ls  # noqa: E402


def lance_source(tmp_path: Path, rows: int) -> str:
    uri = str(tmp_path / "source.lance")
    lance.write_dataset(pa.table({"value": list(range(rows))}), uri, max_rows_per_file=3)
    return uri


def values(ds: Dataset, context: RuntimeContext | None = None) -> list[int]:
    return [int(s["value"]) for s in (ds.iter_context(context) if context else ds)]


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def bump(self) -> None:
        with self.lock:
            self.calls += 1


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


def test_a_local_closure_before_snapshot_is_built_once_and_reused(tmp_path: Path, cache_dir: str) -> None:
    calls = 0

    def transform(sample: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls  # captured state changes while it runs: fingerprinted at snapshot() time
        calls += 1
        return {**sample, "processed": True}

    ds = Dataset.from_source("lance", lance_source(tmp_path, 4)).map(transform).snapshot(cache_dir=cache_dir)
    assert calls == 0
    assert values(ds) == [0, 1, 2, 3] and calls == 4
    assert values(ds) == [0, 1, 2, 3] and calls == 4
    assert len(cache_ls(cache_dir)) == 1


def test_a_lambda_before_cache_is_accepted(tmp_path: Path, cache_dir: str) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 3)).map(lambda s: {**s, "value": s["value"] * 2})
    assert values(ds.cache(cache_dir=cache_dir)) == [0, 2, 4]


def test_closures_with_other_captured_values_make_other_entries(tmp_path: Path, cache_dir: str) -> None:
    source = lance_source(tmp_path, 3)

    def shifted(offset: int) -> Dataset:
        return Dataset.from_source("lance", source).map(lambda s: {**s, "value": s["value"] + offset})

    assert values(shifted(10).cache(cache_dir=cache_dir)) == [10, 11, 12]
    assert values(shifted(20).cache(cache_dir=cache_dir)) == [20, 21, 22]
    assert len(cache_ls(cache_dir)) == 2


def test_split_after_snapshot_cuts_the_materialised_rows(tmp_path: Path, cache_dir: str) -> None:
    first, second = (
        Dataset.from_source("lance", lance_source(tmp_path, 7)).snapshot(cache_dir=cache_dir).split([1, 1])
    )
    assert (values(first), values(second)) == ([0, 1, 2, 3], [4, 5, 6])


def test_sample_after_snapshot_is_seeded_and_row_exact(tmp_path: Path, cache_dir: str) -> None:
    snap = Dataset.from_source("lance", lance_source(tmp_path, 10)).snapshot(cache_dir=cache_dir)
    first = values(snap.sample(0.4, seed=7))
    assert len(set(first)) == 4
    assert first == values(snap.sample(0.4, seed=7))
    assert first != values(snap.sample(0.4, seed=8))
    assert len(cache_ls(cache_dir)) == 1  # every subset reads the one snapshot


def test_a_subset_of_a_snapshot_subset_is_refused(tmp_path: Path, cache_dir: str) -> None:
    first, _ = (
        Dataset.from_source("lance", lance_source(tmp_path, 7)).snapshot(cache_dir=cache_dir).split([1, 1])
    )
    with pytest.raises(ValueError, match="UnsupportedNestedSnapshotSubset"):
        first.sample(0.5)


def test_a_subset_after_stages_following_the_snapshot_is_refused(tmp_path: Path) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 4)).snapshot().select(["value"])
    with pytest.raises(ConfigError, match="InvalidSubsetPlacement"):
        ds.split([1, 1])


def test_a_snapshot_built_for_two_ranks_is_reused_by_three(tmp_path: Path, cache_dir: str) -> None:
    counter = Counter()

    def transform(sample: dict[str, Any]) -> dict[str, Any]:
        counter.bump()
        return sample

    snap = (
        Dataset.from_source("lance", lance_source(tmp_path, 6)).map(transform).snapshot(cache_dir=cache_dir)
    )
    both = [values(snap, RuntimeContext(rank=r, world_size=2)) for r in range(2)]
    assert sorted(v for part in both for v in part) == list(range(6)) and counter.calls == 6
    three = [values(snap, RuntimeContext(rank=r, world_size=3)) for r in range(3)]
    assert sorted(v for part in three for v in part) == list(range(6))
    assert counter.calls == 6  # the entry is the merged dataset, read under any world size


def test_concurrent_readers_build_the_snapshot_once(tmp_path: Path, cache_dir: str) -> None:
    counter = Counter()

    def transform(sample: dict[str, Any]) -> dict[str, Any]:
        counter.bump()
        return sample

    snap = (
        Dataset.from_source("lance", lance_source(tmp_path, 8)).map(transform).snapshot(cache_dir=cache_dir)
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(lambda r: values(snap, RuntimeContext(rank=r, world_size=2)), range(2)))
    assert sorted(v for part in parts for v in part) == list(range(8))
    assert counter.calls == 8


def test_a_resampling_source_is_refused_at_snapshot(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="finite pipeline"):
        Dataset.from_source("lance", lance_source(tmp_path, 2), resample=True).snapshot()


def test_a_provider_that_is_not_callable_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="must be callable"):
        Dataset.from_source("lance", lance_source(tmp_path, 2)).snapshot("invalid")  # type: ignore[arg-type]


def test_a_provider_returning_an_empty_string_is_refused_at_snapshot(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        Dataset.from_source("lance", lance_source(tmp_path, 2)).snapshot(lambda: "")


def test_a_non_dict_sample_before_snapshot_is_a_type_error(tmp_path: Path, cache_dir: str) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 2)).map(lambda s: s["value"])
    with pytest.raises(TypeError, match="expected dict sample"):
        values(ds.snapshot(cache_dir=cache_dir))


def test_snapshot_of_a_dataset_with_a_pending_state_is_refused(tmp_path: Path) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 3))
    iterator = iter(ds)
    next(iterator)
    ds.load_state_dict(ds.state_dict())
    with pytest.raises(ValueError, match="pending resume state"):
        ds.snapshot()
