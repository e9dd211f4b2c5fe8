"""Broken data is named and skippable everywhere: every format's read errors name the URL and the member or
line, have the same type through the daemon and directly, and `on_error="skip"` skips them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import CorruptShardError, RemoteFailed, RemoteNotFound

ROWS = 5


def write_jsonl(path: Path, bad_line: int | None = None) -> str:
    lines = [json.dumps({"id": i}) for i in range(ROWS)]
    if bad_line is not None:
        lines[bad_line - 1] = '{"id": 2, "text": "cut here'
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path: Path, truncate: bool = False) -> str:
    pq.write_table(pa.table({"id": list(range(ROWS))}), path)
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return str(path)


def read_all(ds: Dataset) -> tuple[list[int], int]:
    """The `id` of every sample (-1 for a tar's), and the shards skipped."""
    it = ds.iter_context(RuntimeContext())
    return [int(s.get("id", -1)) for s in it], it.skipped_shards


def through(daemon_factory, folder: Path) -> DaemonClient:  # type: ignore[no-untyped-def]
    return DaemonClient(str(daemon_factory(allow=[str(folder)]).socket), required=True)


def test_a_jsonl_line_that_is_not_json_raises_corrupt_shard_naming_the_file_and_line(tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", bad_line=3)
    with pytest.raises(CorruptShardError, match=r"bad\.jsonl at line 3: not valid JSON") as info:
        read_all(Dataset.from_source("jsonl", bad, daemon=None))
    assert info.value.line == 3 and info.value.shard == bad


def test_on_error_skip_skips_a_jsonl_file_with_a_line_that_is_not_json_and_counts_it(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl")
    bad = write_jsonl(tmp_path / "bad.jsonl", bad_line=3)
    ids, skipped = read_all(Dataset.from_source("jsonl", [good, bad], daemon=None, on_error="skip"))
    assert sorted(ids) == sorted([*range(ROWS), 0, 1])  # bad.jsonl's lines before the broken one
    assert skipped == 1


def test_a_jsonl_line_that_is_not_json_raises_corrupt_shard_through_the_daemon(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    bad = write_jsonl(tmp_path / "bad.jsonl", bad_line=3)
    with pytest.raises(CorruptShardError, match=r"bad\.jsonl at line 3"):
        read_all(Dataset.from_source("jsonl", bad, daemon=through(daemon_factory, tmp_path)))


def test_a_truncated_parquet_file_raises_corrupt_shard_naming_its_url(tmp_path: Path) -> None:
    bad = write_parquet(tmp_path / "bad.parquet", truncate=True)
    with pytest.raises(CorruptShardError, match=r"bad\.parquet at member 'its footer': ArrowInvalid"):
        read_all(Dataset.from_source("parquet", bad, daemon=None))


def test_on_error_skip_skips_a_truncated_parquet_file_and_counts_it(tmp_path: Path) -> None:
    good = write_parquet(tmp_path / "good.parquet")
    bad = write_parquet(tmp_path / "bad.parquet", truncate=True)
    ids, skipped = read_all(Dataset.from_source("parquet", [good, bad], daemon=None, on_error="skip"))
    assert sorted(ids) == list(range(ROWS))
    assert skipped == 1


def test_a_truncated_parquet_file_raises_corrupt_shard_through_the_daemon(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    bad = write_parquet(tmp_path / "bad.parquet", truncate=True)
    with pytest.raises(CorruptShardError, match=r"bad\.parquet"):
        read_all(Dataset.from_source("parquet", bad, daemon=through(daemon_factory, tmp_path)))


def test_on_error_skip_skips_a_missing_parquet_file_through_the_daemon(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    good = write_parquet(tmp_path / "good.parquet")
    gone = write_parquet(tmp_path / "gone.parquet")
    client = through(daemon_factory, tmp_path)
    ds = Dataset.from_source("parquet", [good, gone], daemon=client, on_error="skip")
    Path(gone).unlink()
    ids, skipped = read_all(ds)
    assert sorted(ids) == list(range(ROWS))
    assert skipped == 1


def test_a_missing_local_shard_read_directly_raises_remote_not_found_naming_it(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None)
    (local_shards.local_dir / local_shards.names[1]).unlink()
    with pytest.raises(RemoteNotFound, match=r"shard_000001\.tar does not exist.*on_error='skip'"):
        read_all(ds)


def test_a_missing_s3_object_read_directly_raises_remote_not_found_naming_its_url(
    make_bucket, s3_client
) -> None:  # type: ignore[no-untyped-def]
    shards = make_bucket(count=2, samples=2, payload_bytes=16)
    s3_client.delete_object(Bucket=shards.bucket, Key="shards/shard_000001.tar")
    url = shards.s3_urls[1]
    with pytest.raises(RemoteNotFound, match=f"{url} does not exist") as info:
        read_all(Dataset.from_source("tars", shards.s3_urls, daemon=None))
    assert info.value.url == url


def test_a_direct_s3_read_without_credentials_names_the_url(
    make_bucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s3fs = pytest.importorskip("s3fs")
    shards = make_bucket(count=1, samples=2, payload_bytes=16)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()  # a filesystem made earlier holds the test credentials
    try:
        with pytest.raises(RemoteFailed, match=f"{shards.s3_urls[0]}: NoCredentialsError"):
            read_all(Dataset.from_source("tars", shards.s3_urls, daemon=None))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
