"""The cache codec and writer: samples go into Lance and come back exactly, in order, from every fragment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

lance = pytest.importorskip("lance")

from shardcache.snapshots.writer import read_rows, write_rows  # noqa: E402
from shardcache.sources.lance.codec import RowEncoder, decode_value, encode_value, native_type  # noqa: E402
from tests.client.snapshots.cache_helpers import assert_same_samples  # noqa: E402


def write_and_read(tmp_path: Path, rows: list[dict[str, Any]], **kw: int) -> list[dict[str, Any]]:
    uri = str(tmp_path / "d.lance")
    result = write_rows(rows, uri, batch_size=kw.get("batch_size", 4), max_rows_per_file=kw.get("rows", 3))
    assert result.rows == len(rows)
    return list(read_rows(uri))


def test_native_values_are_stored_as_native_arrow_columns() -> None:
    encoder = RowEncoder()
    encoder.fit([{"__key__": "a", "n": 1, "x": 0.5, "b": True, "s": "t", "raw": b"\x00", "ids": [1, 2]}])
    kinds = {f.name: str(f.type) for f in encoder.schema}
    assert kinds == {
        "__key__": "large_string",
        "n": "int64",
        "x": "double",
        "b": "bool",
        "s": "large_string",
        "raw": "large_binary",
        "ids": "large_list<item: int64>",
    }


def test_values_arrow_cannot_hold_natively_get_tagged_bytes() -> None:
    for value in (
        np.arange(3),
        (1, 2),
        {"a": 1},
        None,
        2**70,
        np.float32(1.5),
        [1, "a"],
        [[1]],
        bytearray(b"x"),
    ):
        assert native_type(value) is None
        assert decode_value(encode_value(value)).__class__ is value.__class__


def test_numpy_arrays_and_torch_tensors_round_trip_exactly(tmp_path: Path) -> None:
    import torch

    rows = [
        {
            "__key__": f"k{i}",
            "image": np.random.default_rng(i).integers(0, 255, (4, 5, 3), dtype=np.uint8),
            "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3) + i),
            "nan": np.array([np.nan, i], dtype=np.float16),
            "objects": np.array([{"a": i}, None], dtype=object),
            "tensor": torch.arange(i + 1, dtype=torch.bfloat16),
            "scalar": np.int64(i),
        }
        for i in range(7)
    ]
    assert_same_samples(rows, write_and_read(tmp_path, rows))


def test_nested_python_objects_and_none_round_trip(tmp_path: Path) -> None:
    rows = [
        {"__key__": f"k{i}", "meta": {"i": i, "tags": ("a", i)}, "maybe": None, "big": 2**80 + i}
        for i in range(5)
    ]
    assert_same_samples(rows, write_and_read(tmp_path, rows))


def test_missing_fields_stay_missing_and_none_stays_none(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"__key__": "a", "x": 1}, {"__key__": "b"}, {"__key__": "c", "x": None}]
    back = write_and_read(tmp_path, rows, batch_size=8)
    assert back == [{"__key__": "a", "x": 1}, {"__key__": "b"}, {"__key__": "c", "x": None}]


def test_a_value_of_another_type_later_in_the_stream_widens_the_layout(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"__key__": f"k{i}", "v": i} for i in range(10)]
    rows += [{"__key__": "late", "v": "text", "extra.field": np.ones(2)}]
    rows += [{"__key__": f"m{i}", "v": [i]} for i in range(5)]
    assert_same_samples(rows, write_and_read(tmp_path, rows))
    assert [p.name for p in tmp_path.iterdir()] == ["d.lance"]


def test_field_names_with_dots_survive(tmp_path: Path) -> None:
    rows = [{"__key__": "a", "seg.png": b"png", "100%.x": 1}]
    assert write_and_read(tmp_path, rows) == rows


def test_every_row_of_many_small_fragments_is_read_back_in_order(tmp_path: Path) -> None:
    rows = [{"__key__": f"k{i:05d}", "i": i} for i in range(1003)]
    uri = str(tmp_path / "d.lance")
    write_rows(rows, uri, batch_size=64, max_rows_per_file=7)
    assert len(lance.dataset(uri).get_fragments()) == 1003 // 7 + 1
    assert list(read_rows(uri)) == rows


def test_an_empty_stream_writes_an_empty_dataset(tmp_path: Path) -> None:
    uri = str(tmp_path / "d.lance")
    assert write_rows([], uri, batch_size=4, max_rows_per_file=3).rows == 0
    assert list(read_rows(uri)) == []


def test_layouts_of_parts_unify_into_one_that_holds_every_value() -> None:
    a, b = RowEncoder(), RowEncoder()
    a.fit([{"__key__": "x", "v": 1, "only_a": "s"}])
    b.fit([{"__key__": "y", "v": "s"}])
    unified = RowEncoder.unify([a.schema, b.schema])
    batch = unified.encode([{"__key__": "x", "v": 1, "only_a": "s"}, {"__key__": "y", "v": "s"}])
    assert batch.num_rows == 2
    assert batch.schema.field("__key__").type == a.schema.field("__key__").type
