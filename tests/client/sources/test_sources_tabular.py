"""The "jsonl", "parquet" and "lance" sources (seed README, Source Types)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import make_tars, slot_contexts
from shardcache import Dataset
from shardcache.errors import ConfigError


def write_jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def jsonl_files(tmp_path: Path) -> list[str]:
    return [
        write_jsonl(tmp_path / f"part_{f}.jsonl", [{"id": f * 100 + i} for i in range(7 + f)])
        for f in range(2)
    ]


@pytest.mark.parametrize("total", [1, 2, 3, 8])
def test_jsonl_lines_are_split_into_slot_aligned_ranges_exactly_once(
    jsonl_files: list[str], total: int
) -> None:
    ds = Dataset.from_source("jsonl", jsonl_files, daemon=None)
    seen = Counter(s["id"] for ctx in slot_contexts(total) for s in ds.iter_context(ctx))
    assert sorted(seen) == [*range(7), *range(100, 108)]
    assert set(seen.values()) == {1}


def test_jsonl_samples_carry_file_and_line_metadata(jsonl_files: list[str]) -> None:
    sample = next(s for s in Dataset.from_source("jsonl", jsonl_files[0], daemon=None) if s["id"] == 3)
    assert sample["__file__"] == jsonl_files[0]
    assert sample["__index_in_file__"] == 3
    assert sample["__key__"] == "part_0.jsonl:3"


def test_jsonl_tar_references_resolve_to_member_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tars(tmp_path / "data" / "tars", 2, 3)
    rows = [
        {
            "image": "tar://tars/shard_000001.tar#s001_0002.txt",
            "more": ["tars/shard_000000.tar#s000_0000.txt"],
        },
    ]
    path = write_jsonl(tmp_path / "meta.jsonl", rows)
    monkeypatch.setenv("LOADER_JSONL_TAR_CACHE_SIZE", "1")
    ds = Dataset.from_source(
        "jsonl",
        path,
        daemon=None,
        ref_fields=[("image", str(tmp_path / "data")), ("more", str(tmp_path / "data"))],
    )
    (sample,) = list(ds)
    assert sample["image"] == b"shard-1-2"
    assert sample["more"] == [b"shard-0-0"]


@pytest.fixture
def parquet_files(tmp_path: Path) -> list[str]:
    paths = []
    for f in range(2):
        table = pa.table(
            {"text": [f"t{f}-{i}" for i in range(10)], "label": list(range(10)), "extra": [0] * 10}
        )
        path = tmp_path / f"train_{f:06d}.parquet"
        pq.write_table(table, path, row_group_size=3)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("total", [1, 2, 3, 8])
def test_parquet_row_groups_are_partitioned_exactly_once(parquet_files: list[str], total: int) -> None:
    ds = Dataset.from_source(
        "parquet", str(Path(parquet_files[0]).parent / "train_{000000..000001}.parquet"), daemon=None
    )
    seen = Counter(s["text"] for ctx in slot_contexts(total) for s in ds.iter_context(ctx))
    assert len(seen) == 20 and set(seen.values()) == {1}


def test_parquet_columns_and_metadata(parquet_files: list[str]) -> None:
    ds = Dataset.from_source("parquet", parquet_files, daemon=None, columns=["text", "label"], batch_size=2)
    sample = next(s for s in ds if s["text"] == "t1-4")
    assert sample == {
        "text": "t1-4",
        "label": 4,
        "__file__": parquet_files[1],
        "__index_in_file__": 4,
        "__key__": "train_000001.parquet:4",
    }


@pytest.fixture
def lance_path(tmp_path: Path) -> str:
    import lance

    path = str(tmp_path / "train.lance")
    lance.write_dataset(
        pa.table({"tokens": list(range(30)), "label": [i % 3 for i in range(30)]}), path, max_rows_per_file=5
    )
    return path


@pytest.mark.parametrize("mode", ["none", "global", "random_scan"])
@pytest.mark.parametrize("total", [1, 3, 8])
def test_lance_modes_partition_rows_exactly_once(lance_path: str, mode: str, total: int) -> None:
    ds = Dataset.from_source("lance", lance_path, columns=["tokens"], shuffle_mode=mode, batch_size=4)
    seen = Counter(s["tokens"] for ctx in slot_contexts(total) for s in ds.iter_context(ctx))
    assert sorted(seen) == list(range(30)) and set(seen.values()) == {1}


def test_lance_none_reads_in_order_and_global_permutes_per_epoch(lance_path: str) -> None:
    ordered = [s["tokens"] for s in Dataset.from_source("lance", lance_path)]
    assert ordered == list(range(30))
    shuffled = Dataset.from_source("lance", lance_path, shuffle_mode="global", batch_size=7)
    first = [s["tokens"] for s in shuffled]
    assert first != ordered and sorted(first) == ordered
    shuffled.set_epoch(0)
    assert [s["tokens"] for s in shuffled] == first
    shuffled.set_epoch(1)
    assert [s["tokens"] for s in shuffled] != first


@pytest.mark.parametrize(
    ("kind", "kwargs", "name"),
    [
        ("csv", {}, "source_kind="),
        ("tars", {"columns": ["a"]}, "columns="),
        ("tars", {"on_corrupt": "ignore"}, "on_corrupt="),
        ("tars", {"sidecars": "x"}, "sidecars="),
        ("jsonl", {"ref_fields": [("a",)]}, "ref_fields="),
        ("parquet", {"batch_size": 0}, "batch_size="),
        ("lance", {"shuffle_mode": "shuffled"}, "shuffle_mode="),
        ("tars", {"daemon": 5}, "daemon="),
        ("tars", {"context": {"rank": 0}}, "context="),
    ],
)
def test_bad_source_arguments_name_the_argument(
    tmp_path: Path, kind: str, kwargs: dict[str, Any], name: str
) -> None:
    shard = make_tars(tmp_path, 1, 1)[0]
    with pytest.raises(ConfigError, match=name):
        Dataset.from_source(kind, shard, **kwargs)
