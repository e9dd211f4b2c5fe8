"""The persistent Lance indexes (sources.lance.index, sources.lance.store): a filter's rows and a reference
table's key -> row map, built once per dataset version under the unified cache root and reused; and the
dataset versions a pipeline pins when it is built."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

lance = pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

from shardcache import CacheConfig, Dataset  # noqa: E402
from shardcache.errors import InvalidPredicate  # noqa: E402
from shardcache.sources.lance import index as lance_index  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.delenv("MVP_DATASET_CACHE_DIR", raising=False)
    monkeypatch.setenv("SHARDCACHE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The fragments each filter-index scan covered (None: the whole dataset), one item per scan."""
    seen: list[Any] = []
    original = lance_index._part_rows

    def counted(ds: Any, uri: str, groups: Any, fragments: Any, bases: Any) -> Any:
        seen.append(None if fragments is None else [int(f.fragment_id) for f in fragments])
        return original(ds, uri, groups, fragments, bases)

    monkeypatch.setattr(lance_index, "_part_rows", counted)
    return seen


def write(tmp_path: Path, rows: int, name: str = "source.lance", mode: str = "create", first: int = 0) -> str:
    uri = str(tmp_path / name)
    table = pa.table({"value": pa.array(range(first, first + rows), type=pa.int64())})
    lance.write_dataset(table, uri, max_rows_per_file=3, mode=mode)
    return uri


def values(ds: Dataset) -> list[int]:
    return [int(s["value"]) for s in ds]


def entries(root: Path, kind: str = "lance-filter-index-v1") -> list[Path]:
    return sorted(root.glob(f"*/{kind}/*"))


def parts(entry: Path) -> dict[str, Any]:
    manifest = json.loads((entry / "manifest.json").read_text())
    return {part["files"][0]: part["metadata"]["count"] for part in manifest["metadata"]["parts"]}


def test_a_filter_index_is_built_once_and_reused_by_later_pipelines(
    tmp_path: Path, cache: Path, builds: list[Any]
) -> None:
    uri = write(tmp_path, 20)
    assert values(Dataset.from_source("lance", uri).filter("value >= 5")) == list(range(5, 20))
    assert values(Dataset.from_source("lance", uri).filter("value >= 5")) == list(range(5, 20))
    assert builds == [None]  # one scan of the whole dataset, then reads of the index
    (entry,) = entries(cache)
    assert (entry / "complete").is_file()
    assert len(parts(entry)) == 7  # 20 rows in fragments of 3: one part per fragment
    assert sum(parts(entry).values()) == 15


def test_another_process_reads_the_index_without_scanning(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 12)
    assert values(Dataset.from_source("lance", uri).filter("value < 4")) == [0, 1, 2, 3]
    script = (
        "from shardcache import Dataset\n"
        "from shardcache.sources.lance import index as lance_index\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError('scanned again')\n"
        "lance_index._part_rows = refuse\n"
        f"print([int(s['value']) for s in Dataset.from_source('lance', {uri!r}).filter('value < 4')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 2, 3]"


def test_a_truncated_part_is_rebuilt_alone_and_never_served(
    tmp_path: Path, cache: Path, builds: list[Any]
) -> None:
    uri = write(tmp_path, 20)
    ds = Dataset.from_source("lance", uri).filter("value >= 5")
    assert values(ds) == list(range(5, 20))
    (entry,) = entries(cache)
    damaged = entry / "part-003.i64"  # fragment 3: rows 9..11
    kept = {p.name: p.stat().st_ino for p in entry.glob("*.i64") if p != damaged}
    with damaged.open("r+b") as f:
        f.truncate(damaged.stat().st_size - 8)

    assert values(ds) == list(range(5, 20))
    assert builds == [None, [3]]  # the repair scanned only the damaged part's fragment
    (entry,) = entries(cache)
    assert damaged.stat().st_size == 3 * 8
    assert {
        p.name: p.stat().st_ino for p in entry.glob("*.i64") if p != damaged
    } == kept  # linked, not rebuilt


def test_a_part_corrupted_in_place_is_detected_by_its_checksum(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 20)
    ds = Dataset.from_source("lance", uri).filter("value >= 5")
    assert values(ds) == list(range(5, 20))
    (entry,) = entries(cache)
    part = entry / "part-002.i64"
    data = bytearray(part.read_bytes())
    data[0:8] = (7).to_bytes(8, "little")  # same size, another row: only the CRC-32 can tell
    part.write_bytes(bytes(data))
    assert values(ds) == list(range(5, 20))


def test_a_new_dataset_version_builds_a_new_entry(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 6)
    assert values(Dataset.from_source("lance", uri).filter("value >= 4")) == [4, 5]
    write(tmp_path, 3, mode="append", first=6)
    assert values(Dataset.from_source("lance", uri).filter("value >= 4")) == [4, 5, 6, 7, 8]
    assert len(entries(cache)) == 2
    assert len({entry.parent.parent for entry in entries(cache)}) == 2  # another source fingerprint


def test_another_predicate_builds_a_new_entry_of_the_same_source(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 6)
    assert values(Dataset.from_source("lance", uri).filter("value >= 4")) == [4, 5]
    assert values(Dataset.from_source("lance", uri).filter(["value = 1", "value = 2"])) == [1, 2]
    found = entries(cache)
    assert len(found) == 2 and found[0].parent == found[1].parent


def test_a_filtered_dataset_pickles_and_its_copy_reuses_the_index(
    tmp_path: Path, cache: Path, builds: list[Any]
) -> None:
    ds = Dataset.from_source("lance", write(tmp_path, 9)).filter("value % 2 = 0")
    assert values(ds) == [0, 2, 4, 6, 8]
    assert values(pickle.loads(pickle.dumps(ds))) == [0, 2, 4, 6, 8]
    assert builds == [None]


def test_the_index_lives_under_the_cache_dir_cache_config_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDCACHE_CACHE_DIR", raising=False)
    monkeypatch.setenv("MVP_DATASET_CACHE_DIR", str(tmp_path / "mvp"))
    uri = write(tmp_path, 6)
    assert values(Dataset.from_source("lance", uri).filter("value > 3")) == [4, 5]
    assert CacheConfig.resolve().root == tmp_path / "mvp"
    assert len(entries(tmp_path / "mvp")) == 1
    assert not (Path(uri) / "_mvp_filter_index").exists()


def test_a_failed_build_publishes_nothing(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 6)
    with pytest.raises(InvalidPredicate):
        values(Dataset.from_source("lance", uri).filter("missing > 0"))
    assert entries(cache) == []
    assert list((cache / "_tmp").iterdir()) == []


def test_a_dataset_with_deleted_rows_is_still_filtered(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 10)
    lance.dataset(uri).delete("value = 1 OR value = 7")
    ds = Dataset.from_source("lance", uri).filter("value < 3 OR value > 6")
    assert values(ds) == [0, 2, 8, 9]
    assert values(ds) == [0, 2, 8, 9]  # read back from the one-part index
    (entry,) = entries(cache)
    assert len(parts(entry)) == 1


def test_a_pipeline_reads_the_version_it_was_built_on(tmp_path: Path, cache: Path) -> None:
    uri = write(tmp_path, 4)
    before = Dataset.from_source("lance", uri)
    filtered = Dataset.from_source("lance", uri).filter("value >= 2")
    write(tmp_path, 2, mode="append", first=4)
    assert values(before) == [0, 1, 2, 3]
    assert values(filtered) == [2, 3]
    after = Dataset.from_source("lance", uri)
    assert values(after) == [0, 1, 2, 3, 4, 5]
    assert after.fingerprint() != before.fingerprint()  # a state of one version does not resume another


def test_a_reference_index_is_built_once_and_reused(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = str(tmp_path / "main.lance")
    refs = str(tmp_path / "refs.lance")
    lance.write_dataset(pa.table({"img": [f"k{i % 3}" for i in range(6)]}), main)
    lance.write_dataset(pa.table({"key": ["k0", "k1", "k2", "k1"], "payload": ["a", "b", "c", "dup"]}), refs)
    scans: list[str] = []
    original = lance_index._scan_keys

    def counted(datasets: Any, key_column: str) -> Any:
        scans.append(key_column)
        return original(datasets, key_column)

    monkeypatch.setattr(lance_index, "_scan_keys", counted)
    config = {"img": {"uri": refs, "key_column": "key", "value_column": "payload"}}
    for _ in range(2):
        ds = Dataset.from_source("lance", main, ref_columns=config).resolve_ref(["img"])
        assert [s["img"] for s in ds] == ["a", "b", "c", "a", "b", "c"]  # the first row of a key wins
    assert scans == ["key"]
    (entry,) = entries(cache, "lance-ref-index-v1")
    assert (entry / "manifest.json").is_file() and (entry / "complete").is_file()


def test_a_reference_index_finds_keys_in_every_bucket_and_none_for_missing_keys(
    tmp_path: Path, cache: Path
) -> None:
    main = str(tmp_path / "main.lance")
    refs = str(tmp_path / "refs.lance")
    wanted = [0, 4095, 4096, 8191, 12000, 5]  # 12000 has no reference row
    lance.write_dataset(pa.table({"ref": pa.array(wanted, type=pa.int64())}), main)
    lance.write_dataset(pa.table({"id": pa.array(range(9000), type=pa.int64()), "v": range(9000)}), refs)
    config = {"ref": {"uri": refs, "key_column": "id", "value_column": "v"}}
    for _ in range(2):  # built, then read back (9000 keys: two buckets)
        ds = Dataset.from_source("lance", main, ref_columns=config).resolve_ref(["ref"])
        assert [s["ref"] for s in ds] == [0, 4095, 4096, 8191, None, 5]
    (entry,) = entries(cache, "lance-ref-index-v1")
    assert len(json.loads((entry / "manifest.json").read_text())["metadata"]["bucket_offsets"]) == 3
