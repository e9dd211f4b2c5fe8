"""Compressed shards as other tools write them (`.tar.gz`, `.tgz`, `.tar.zst`, `.jsonl.gz`, `.jsonl.zst`),
read directly and through the real daemon, which caches the compressed file as it is."""

from __future__ import annotations

import gzip
import io
import json
import logging
import tarfile
from pathlib import Path

import pytest
import zstandard

from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import CorruptShardError
from shardcache.sources.manifests import write_manifest

SAMPLES = 6


def members(shard: int) -> list[tuple[str, bytes]]:
    """WebDataset's layout: `<key>.<field>` members, the fields of one sample next to each other."""
    out = []
    for i in range(SAMPLES):
        key = f"s{shard:02d}_{i:03d}"
        out.append((f"{key}.bin", bytes((shard * 7 + i + j) % 256 for j in range(300))))
        out.append((f"{key}.json", json.dumps({"shard": shard, "i": i}).encode()))
    return out


def tar_bytes(shard: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members(shard):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_tar_gz(path: Path, shard: int) -> None:
    """As `tar czf` and WebDataset's writers do: tarfile's own gzip mode."""
    with tarfile.open(path, mode="w:gz") as tar:
        for name, data in members(shard):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_tar_zst(path: Path, shard: int) -> None:
    path.write_bytes(zstandard.ZstdCompressor().compress(tar_bytes(shard)))


def jsonl_bytes(shard: int, rows: int = 10) -> bytes:
    return b"".join(json.dumps({"shard": shard, "row": r}).encode() + b"\n" for r in range(rows))


def expected_samples(shards: list[int]) -> list[tuple[str, bytes, bytes]]:
    out = []
    for shard in shards:
        fields = dict(members(shard))
        for i in range(SAMPLES):
            key = f"s{shard:02d}_{i:03d}"
            out.append((key, fields[f"{key}.bin"], fields[f"{key}.json"]))
    return out


def read_tars(urls: list[str] | str, **kwargs) -> list[tuple[str, bytes, bytes]]:
    # Shards in the order given, so the samples compare one for one with the files written.
    ds = Dataset.from_source("tars", urls, shuffle_mode="none", **kwargs)
    return [(s["__key__"], s["bin"], s["json"]) for s in ds.iter_context(RuntimeContext())]


def test_tar_gz_shards_written_by_tarfile_read_like_plain_tars(tmp_path: Path) -> None:
    for i in range(2):
        write_tar_gz(tmp_path / f"shard_{i}.tar.gz", i)
    urls = [str(tmp_path / f"shard_{i}.tar.gz") for i in range(2)]
    assert read_tars(urls, daemon=None) == expected_samples([0, 1])


def test_tgz_is_a_gzip_compressed_tar(tmp_path: Path) -> None:
    write_tar_gz(tmp_path / "shard.tgz", 3)
    assert read_tars(str(tmp_path / "shard.tgz"), daemon=None) == expected_samples([3])


def test_tar_zst_shards_are_read_with_zstandard(tmp_path: Path) -> None:
    write_tar_zst(tmp_path / "shard_0.tar.zst", 0)
    assert read_tars(str(tmp_path / "shard_0.tar.zst"), daemon=None) == expected_samples([0])


def test_brace_ranges_and_globs_expand_compressed_names(tmp_path: Path) -> None:
    for i in range(3):
        write_tar_gz(tmp_path / f"shard_{i:02d}.tar.gz", i)
    assert read_tars(str(tmp_path / "shard_{00..02}.tar.gz"), daemon=None) == expected_samples([0, 1, 2])
    assert read_tars(str(tmp_path / "*.tar.gz"), daemon=None) == expected_samples([0, 1, 2])


def test_compressed_tars_come_through_the_daemon_which_caches_them_compressed(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "data"
    folder.mkdir()
    write_tar_gz(folder / "a.tar.gz", 0)
    write_tar_zst(folder / "b.tar.zst", 1)
    urls = [str(folder / "a.tar.gz"), str(folder / "b.tar.zst")]
    daemon = daemon_factory(allow=[str(folder)])
    with DaemonClient(daemon.socket, required=True) as client:
        assert read_tars(urls, daemon=client) == expected_samples([0, 1])
        resident = {Path(shard.url).name: shard.size for shard in client.shards()}
    assert resident == {name: (folder / name).stat().st_size for name in ("a.tar.gz", "b.tar.zst")}


def test_jsonl_gz_and_jsonl_zst_read_like_plain_jsonl(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(0)))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(1)))
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes(2))
    ds = Dataset.from_source(
        "jsonl", [str(tmp_path / n) for n in ("a.jsonl.gz", "b.jsonl.zst", "c.jsonl")], daemon=None
    )
    rows = sorted((row["shard"], row["row"]) for row in ds.iter_context(RuntimeContext()))
    assert rows == [(s, r) for s in range(3) for r in range(10)]


def test_jsonl_gz_comes_through_the_daemon(tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(0)))
    daemon = daemon_factory(allow=[str(tmp_path)])
    ds = Dataset.from_source("jsonl", str(tmp_path / "a.jsonl.gz"), daemon=daemon.socket)
    assert [row["row"] for row in ds.iter_context(RuntimeContext())] == list(range(10))


def test_a_truncated_tar_gz_raises_corrupt_shard_naming_it(tmp_path: Path) -> None:
    write_tar_gz(tmp_path / "whole.tar.gz", 0)
    data = (tmp_path / "whole.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptShardError, match="cut.tar.gz"):
        read_tars(str(tmp_path / "cut.tar.gz"), daemon=None)


def test_on_corrupt_skip_counts_a_truncated_tar_gz_as_a_skip(tmp_path: Path) -> None:
    write_tar_gz(tmp_path / "shard_0.tar.gz", 0)
    write_tar_gz(tmp_path / "shard_1.tar.gz", 1)
    data = (tmp_path / "shard_1.tar.gz").read_bytes()
    (tmp_path / "shard_1.tar.gz").write_bytes(data[: len(data) // 2])
    ds = Dataset.from_source("tars", str(tmp_path / "shard_{0..1}.tar.gz"), daemon=None, on_corrupt="skip")
    it = ds.iter_context(RuntimeContext())
    keys = [s["__key__"] for s in it]
    assert it.skipped_shards == 1
    assert keys[:SAMPLES] == [k for k, _, _ in expected_samples([0])]


@pytest.mark.parametrize("name", ["empty.tar", "empty.tar.gz", "empty.jsonl", "empty.jsonl.zst"])
def test_a_zero_byte_shard_warns_and_yields_nothing(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / name).write_bytes(b"")
    kind = "tars" if ".tar" in name else "jsonl"
    with caplog.at_level(logging.WARNING, logger="shardcache"):
        got = list(
            Dataset.from_source(kind, str(tmp_path / name), daemon=None).iter_context(RuntimeContext())
        )
    assert got == []
    assert any(name in r.getMessage() and "0 bytes" in r.getMessage() for r in caplog.records)


def test_manifest_counts_the_samples_of_compressed_shards(tmp_path: Path) -> None:
    write_tar_gz(tmp_path / "a.tar.gz", 0)
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(1, rows=7)))
    write_manifest([str(tmp_path / "a.tar.gz"), str(tmp_path / "b.jsonl.zst")], tmp_path / "m.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [row["num_samples"] for row in rows] == [SAMPLES, 7]
