"""`.cache()` through the real pipeline: sources round-trip; invalidation, rejection, execution model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

lance = pytest.importorskip("lance")

from harness.shards import make_tar_shard  # noqa: E402
from shardcache import Dataset, RuntimeContext  # noqa: E402
from shardcache.errors import ConfigError  # noqa: E402
from shardcache.pipeline.build import build  # noqa: E402
from shardcache.snapshots import cache_ls, materialise, read_rows  # noqa: E402
from tests.client.snapshots import cache_helpers  # noqa: E402
from tests.client.snapshots.cache_helpers import assert_same_samples  # noqa: E402

CTX = RuntimeContext()


@pytest.fixture
def tars(tmp_path: Path) -> str:
    directory = tmp_path / "tars"
    directory.mkdir()
    for i in range(4):
        make_tar_shard(directory / f"shard_{i:06d}.tar", i, samples=9, payload_bytes=64)
    return str(directory / "shard_{000000..000003}.tar")


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


def tar_source(tars: str) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None)


def make_source(kind: str, tmp_path: Path, tars: str) -> Dataset:
    if kind == "tars":
        return tar_source(tars)
    if kind == "jsonl":
        path = tmp_path / "rows.jsonl"
        path.write_text(
            "".join(json.dumps({"i": i, "text": "w" * i, "ids": [i, i + 1]}) + "\n" for i in range(23))
        )
        return Dataset.from_source("jsonl", str(path), daemon=None)
    import pyarrow as pa

    table = pa.table(
        {"i": list(range(23)), "name": [f"n{i}" for i in range(23)], "x": [i / 3 for i in range(23)]}
    )
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, tmp_path / "rows.parquet", row_group_size=5)
        return Dataset.from_source("parquet", str(tmp_path / "rows.parquet"), daemon=None)
    lance.write_dataset(table, str(tmp_path / "rows.lance"), max_rows_per_file=4)
    return Dataset.from_source("lance", str(tmp_path / "rows.lance"))


def rows(dataset: Dataset, ctx: RuntimeContext = CTX) -> list[dict[str, Any]]:
    return list(dataset.iter_context(ctx))


@pytest.mark.parametrize("kind", ["tars", "jsonl", "parquet", "lance"])
def test_every_source_round_trips_through_cache(kind: str, tmp_path: Path, tars: str, cache_dir: str) -> None:
    source = make_source(kind, tmp_path, tars)
    expected = rows(source)
    cached = source.cache(cache_dir=cache_dir, max_rows_per_fragment=4)
    assert rows(cached) == expected
    assert rows(cached) == expected  # the second pass reads the entry
    [entry] = cache_ls(cache_dir)
    assert entry.complete and entry.rows == len(expected)


def test_stages_after_cache_run_on_every_iteration(tars: str, cache_dir: str) -> None:
    pipeline = (
        tar_source(tars)
        .map(cache_helpers.add_length)
        .cache(cache_dir=cache_dir)
        .map(cache_helpers.add_digest)
    )
    assert all(sample["digest"] and sample["length"] == 64 for sample in rows(pipeline))


def test_a_small_fragment_size_loses_no_row(tars: str, cache_dir: str) -> None:
    source = tar_source(tars).map(cache_helpers.add_length)
    cached = source.cache(cache_dir=cache_dir, max_rows_per_fragment=2, cache_write_batch_size=3)
    assert rows(cached) == rows(source)
    [entry] = cache_ls(cache_dir)
    assert len(lance.dataset(entry.path + "/dataset/data.lance").get_fragments()) == 18


def test_numpy_arrays_and_tensors_round_trip_exactly(tars: str, cache_dir: str) -> None:
    source = tar_source(tars).map(cache_helpers.add_arrays)
    path = materialise(source.spec, CTX, {"cache_dir": cache_dir, "max_rows_per_fragment": 5}, build)
    assert_same_samples(rows(source), list(read_rows(path)))


def test_keys_and_user_fields_survive_unchanged(tars: str, cache_dir: str) -> None:
    source = tar_source(tars).map(cache_helpers.parse_json)
    path = materialise(source.spec, CTX, {"cache_dir": cache_dir}, build)
    assert list(read_rows(path)) == rows(source)


def entries_after(cache_dir: str, *pipelines: Dataset) -> int:
    for pipeline in pipelines:
        rows(pipeline)
    return len(cache_ls(cache_dir))


def test_a_changed_map_function_makes_a_new_entry(tars: str, cache_dir: str) -> None:
    a = tar_source(tars).map(cache_helpers.add_length).cache(cache_dir=cache_dir)
    b = tar_source(tars).map(cache_helpers.add_digest).cache(cache_dir=cache_dir)
    assert entries_after(cache_dir, a, a, b) == 2


def test_a_changed_global_of_the_map_function_makes_a_new_entry(
    tars: str, cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = tar_source(tars).map(cache_helpers.add_length).cache(cache_dir=cache_dir)
    before = rows(pipeline)
    monkeypatch.setattr(cache_helpers, "OFFSET", 1)
    after = rows(pipeline)
    assert [s["length"] + 1 for s in before] == [s["length"] for s in after]
    assert len(cache_ls(cache_dir)) == 2


def test_changed_select_fields_make_a_new_entry(tars: str, cache_dir: str) -> None:
    a = tar_source(tars).select(["bin"]).cache(cache_dir=cache_dir)
    b = tar_source(tars).select(["bin", "json"]).cache(cache_dir=cache_dir)
    assert entries_after(cache_dir, a, b) == 2
    assert "json" not in rows(a)[0] and "json" in rows(b)[0]


def test_assemble_drop_last_is_part_of_the_fingerprint(tars: str, cache_dir: str) -> None:
    keep = tar_source(tars).assemble(cache_helpers.PairUp).cache(cache_dir=cache_dir)
    drop = tar_source(tars).assemble(cache_helpers.PairUp, drop_last=True).cache(cache_dir=cache_dir)
    assert len(rows(keep)) == 18 and len(rows(drop)) == 18  # 36 rows pair up evenly
    assert len(cache_ls(cache_dir)) == 2


def test_a_modified_shard_makes_a_new_entry(tmp_path: Path, tars: str, cache_dir: str) -> None:
    pipeline = tar_source(tars).cache(cache_dir=cache_dir)
    assert len(rows(pipeline)) == 36
    make_tar_shard(tmp_path / "tars" / "shard_000002.tar", 2, samples=3, payload_bytes=64)
    assert len(rows(pipeline)) == 30
    assert len(cache_ls(cache_dir)) == 2


def test_another_shard_list_makes_a_new_entry(tmp_path: Path, tars: str, cache_dir: str) -> None:
    fewer = Dataset.from_source("tars", str(tmp_path / "tars" / "shard_{000000..000002}.tar"), daemon=None)
    assert (
        entries_after(
            cache_dir, tar_source(tars).cache(cache_dir=cache_dir), fewer.cache(cache_dir=cache_dir)
        )
        == 2
    )


def test_shuffle_before_cache_is_not_part_of_the_fingerprint(tars: str, cache_dir: str) -> None:
    a = tar_source(tars).shuffle(4).cache(cache_dir=cache_dir)
    b = tar_source(tars).shuffle(16).cache(cache_dir=cache_dir)
    assert entries_after(cache_dir, a, b) == 1


def test_shuffle_before_cache_logs_a_warning(tars: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shardcache.snapshots"):
        tar_source(tars).shuffle(8).cache()
    assert any("shuffle" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_batch_before_cache_is_rejected(tars: str) -> None:
    with pytest.raises(ConfigError, match="batch"):
        tar_source(tars).batch(4).cache()


def test_unbatch_before_cache_is_rejected(tars: str) -> None:
    with pytest.raises(ConfigError, match=r"\.unbatch\(\) before \.cache\(\)"):
        tar_source(tars).unbatch().cache()


def test_stages_after_cache_may_be_lambdas(tars: str, cache_dir: str) -> None:
    pipeline = tar_source(tars).cache(cache_dir=cache_dir).map(lambda s: s["__key__"])
    assert len(rows(pipeline)) == 36


def test_parallel_leading_maps_give_the_same_rows_in_the_same_order(tmp_path: Path, tars: str) -> None:
    source = (
        tar_source(tars)
        .map(cache_helpers.heavy_decode)
        .map(cache_helpers.add_length)
        .assemble(cache_helpers.PairUp)
    )
    serial = rows(source.cache(cache_dir=str(tmp_path / "serial")))
    parallel = rows(source.cache(cache_dir=str(tmp_path / "parallel"), cache_num_workers=2))
    assert parallel == serial == rows(source)


def test_parts_merge_in_numeric_slot_order(tmp_path: Path, cache_dir: str) -> None:
    directory = tmp_path / "many"
    directory.mkdir()
    for i in range(12):
        make_tar_shard(directory / f"shard_{i:06d}.tar", i, samples=2, payload_bytes=8)
    source = Dataset.from_source("tars", str(directory / "shard_{000000..000011}.tar"), daemon=None)
    path = materialise(source.spec, RuntimeContext(rank=0, world_size=12), {"cache_dir": cache_dir}, build)
    expected = [s["__key__"] for k in range(12) for s in rows(source, RuntimeContext(rank=k, world_size=12))]
    assert [s["__key__"] for s in read_rows(path)] == expected


def test_the_env_variable_moves_the_default_cache_root(
    tmp_path: Path, tars: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDCACHE_CACHE_DIR", str(tmp_path / "from-env"))
    monkeypatch.chdir(tmp_path)
    rows(tar_source(tars).cache())
    assert len(cache_ls(str(tmp_path / "from-env"))) == 1
    assert not (tmp_path / ".cache").exists()


def test_an_array_valued_map_round_trips_through_cache(tars: str, cache_dir: str) -> None:
    source = tar_source(tars).map(cache_helpers.add_arrays)
    assert_same_samples(rows(source), rows(source.cache(cache_dir=cache_dir)))
    assert isinstance(rows(source.cache(cache_dir=cache_dir))[0]["array"], np.ndarray)


def test_s3_shards_are_fingerprinted_by_etag_and_a_rewritten_object_makes_a_new_entry(
    make_bucket: Any, s3_client: Any, tmp_path: Path, cache_dir: str
) -> None:
    shards = make_bucket(count=2, samples=3, payload_bytes=64)
    pipeline = Dataset.from_source("tars", shards.s3_urls, daemon=None).map(cache_helpers.add_length)
    cached = pipeline.cache(cache_dir=cache_dir)
    assert rows(cached) == rows(pipeline)
    assert entries_after(cache_dir, cached) == 1
    make_tar_shard(tmp_path / "new.tar", 7, samples=5, payload_bytes=64)
    s3_client.upload_file(str(tmp_path / "new.tar"), shards.bucket, f"shards/{shards.names[1]}")
    assert len(rows(cached)) == 8
    assert len(cache_ls(cache_dir)) == 2
