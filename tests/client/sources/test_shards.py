"""Shard lists: brace ranges, globs, manifests, and `write_manifest`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import keys, make_tars
from shardcache import Dataset
from shardcache.errors import ConfigError
from shardcache.shards import ShardRef, expand_shards
from shardcache.sources.manifests import write_manifest


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "d", 3, 2)


def test_brace_ranges_expand_in_order(tars: list[str], tmp_path: Path) -> None:
    refs = expand_shards(str(tmp_path / "d" / "shard_{000000..000002}.tar"))
    assert [r.url for r in refs] == tars


def test_globs_are_sorted(tars: list[str], tmp_path: Path) -> None:
    assert [r.url for r in expand_shards(str(tmp_path / "d" / "*.tar"))] == tars


def test_lists_mix_paths_and_refs(tars: list[str]) -> None:
    refs = expand_shards([tars[0], ShardRef(tars[1], size=3)])
    assert refs == [ShardRef(tars[0]), ShardRef(tars[1], size=3)]


def test_missing_path_and_empty_glob_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.tar does not exist"):
        expand_shards(str(tmp_path / "missing.tar"))
    with pytest.raises(ConfigError, match="matches no file"):
        expand_shards(str(tmp_path / "*.nothing"))
    with pytest.raises(ConfigError, match="shards="):
        expand_shards(42)


def test_write_manifest_records_size_checksum_and_samples(tars: list[str], tmp_path: Path) -> None:
    out = tmp_path / "m" / "train.jsonl"
    assert write_manifest(str(tmp_path / "d" / "*.tar"), out) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    data = Path(tars[0]).read_bytes()
    assert rows[0] == {
        "url": tars[0],
        "size": len(data),
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
        "num_samples": 2,
        "sample_offsets": [0],  # sample 0 starts at byte 0; one offset per OFFSET_EVERY samples
    }


def test_manifest_counts_jsonl_and_parquet(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n\n{"x": 2}\n')
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "b.parquet")
    write_manifest([str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")], tmp_path / "m.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["num_samples"] for r in rows] == [2, 3]


def test_a_manifest_is_a_shard_list(tars: list[str], tmp_path: Path) -> None:
    write_manifest(tars, tmp_path / "train.manifest.jsonl")
    via_manifest = Dataset.from_source("tars", str(tmp_path / "train.manifest.jsonl"), daemon=None)
    assert via_manifest.source.shards[0].checksum is not None
    assert keys(via_manifest) == keys(Dataset.from_source("tars", tars, daemon=None))


def test_manifest_relative_urls_resolve_against_the_manifest(tars: list[str], tmp_path: Path) -> None:
    (tmp_path / "d" / "rel.jsonl").write_text(json.dumps({"url": "shard_000001.tar"}) + "\n")
    assert expand_shards(str(tmp_path / "d" / "rel.jsonl")) == [ShardRef(tars[1])]


def test_malformed_manifest_line_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"nourl": 1}\n')
    with pytest.raises(ConfigError, match="bad.jsonl line 1"):
        expand_shards(str(tmp_path / "bad.jsonl"))
