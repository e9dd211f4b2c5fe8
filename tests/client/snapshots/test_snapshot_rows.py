"""mvp-dataset 0.2.3's snapshot rows and snapshot identity (issue 19): the upstream `__key__`/`__file__`
stored as `__source_key__`/`__source_file__`, fresh row metadata on read, the entry named when `snapshot()`
is called (a complete snapshot is read after its source is gone), and `.cache()` left as it was."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

lance = pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

from shardcache import Dataset  # noqa: E402
from shardcache.snapshots import cache_ls  # noqa: E402


def lance_source(tmp_path: Path, rows: int, name: str = "source.lance") -> str:
    uri = str(tmp_path / name)
    lance.write_dataset(pa.table({"value": list(range(rows))}), uri, max_rows_per_file=3)
    return uri


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


def test_snapshot_rows_store_the_upstream_key_and_file_as_source_metadata(
    tmp_path: Path, cache_dir: str
) -> None:
    source = lance_source(tmp_path, 4)
    rows = list(Dataset.from_source("lance", source).snapshot(cache_dir=cache_dir))
    assert [r["__source_key__"] for r in rows] == [f"{source}:{i}" for i in range(4)]
    assert all(r["__source_file__"] == source for r in rows)


def test_snapshot_rows_carry_the_metadata_of_the_snapshot_dataset(tmp_path: Path, cache_dir: str) -> None:
    source = lance_source(tmp_path, 4)
    rows = list(Dataset.from_source("lance", source).snapshot(cache_dir=cache_dir))
    snapshot_file = rows[0]["__file__"]
    assert snapshot_file != source and snapshot_file.startswith(cache_dir)
    assert [r["__key__"] for r in rows] == [f"{snapshot_file}:{i}" for i in range(4)]
    assert [r["__local_index__"] for r in rows] == [0, 1, 2, 3]
    assert [r["__global_index__"] for r in rows] == [0, 1, 2, 3]


def test_a_sample_holding_both_key_and_source_key_is_refused(tmp_path: Path, cache_dir: str) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 2)).map(lambda s: {**s, "__source_key__": "x"})
    with pytest.raises(ValueError, match=r"\[SnapshotSourceMetadataConflict\]"):
        list(ds.snapshot(lambda: "conflict", cache_dir=cache_dir))


def test_a_sample_holding_both_file_and_source_file_is_refused(tmp_path: Path, cache_dir: str) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 2)).map(lambda s: {**s, "__source_file__": "x"})
    with pytest.raises(ValueError, match=r"\[SnapshotSourceMetadataConflict\]"):
        list(ds.snapshot(cache_dir=cache_dir))


def test_a_source_key_without_a_key_is_stored_as_is(tmp_path: Path, cache_dir: str) -> None:
    def keep_value(sample: dict[str, Any]) -> dict[str, Any]:
        return {"value": sample["value"], "__source_key__": f"mine-{sample['value']}"}

    ds = Dataset.from_source("lance", lance_source(tmp_path, 2)).map(keep_value)
    assert [r["__source_key__"] for r in ds.snapshot(cache_dir=cache_dir)] == ["mine-0", "mine-1"]


def test_a_complete_snapshot_is_read_after_its_source_is_deleted(tmp_path: Path, cache_dir: str) -> None:
    calls = 0

    def transform(sample: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {**sample, "processed": True}

    source = lance_source(tmp_path, 4)
    ds = Dataset.from_source("lance", source).map(transform).snapshot(cache_dir=cache_dir)
    first = list(ds)
    shutil.rmtree(source)
    assert list(ds) == first and calls == 4


def test_snapshot_names_its_entry_when_called_not_when_iterated(tmp_path: Path, cache_dir: str) -> None:
    source = lance_source(tmp_path, 3)
    ds = Dataset.from_source("lance", source).snapshot(cache_dir=cache_dir)
    assert [r["value"] for r in ds] == [0, 1, 2]
    # A rewritten source is a new snapshot only for a snapshot() called after the rewrite.
    lance.write_dataset(pa.table({"value": [7, 8]}), source, mode="overwrite")
    assert [r["value"] for r in ds] == [0, 1, 2]
    assert [r["value"] for r in Dataset.from_source("lance", source).snapshot(cache_dir=cache_dir)] == [7, 8]


def test_snapshot_and_cache_of_one_pipeline_are_separate_entries(tmp_path: Path, cache_dir: str) -> None:
    source = lance_source(tmp_path, 2)
    cached = list(Dataset.from_source("lance", source).cache(cache_dir=cache_dir))
    snapshot = list(Dataset.from_source("lance", source).snapshot(cache_dir=cache_dir))
    assert len(cache_ls(cache_dir)) == 2
    # .cache() keeps the rows' metadata as written; snapshot() renames it.
    assert [r["__key__"] for r in cached] == [r["__source_key__"] for r in snapshot]
    assert all("__source_key__" not in r for r in cached)


def test_a_snapshot_provider_is_called_once(tmp_path: Path, cache_dir: str) -> None:
    calls = []

    def provider() -> str:
        calls.append(1)
        return "v1"

    ds = Dataset.from_source("lance", lance_source(tmp_path, 2)).snapshot(provider, cache_dir=cache_dir)
    list(ds)
    list(ds)
    assert len(calls) == 1
