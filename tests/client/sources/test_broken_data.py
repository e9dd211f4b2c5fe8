"""Broken data is named and skippable everywhere: every format's read errors name the URL and the member or
line, have the same type through the daemon and directly, and `on_error="skip"` skips them."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.daemon_api import client_samples
from harness.polling import wait_for
from harness.start_methods import worker_context
from shardcache import Dataset, RuntimeContext, TorchLoader
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import CorruptShardError, RemoteFailed, RemoteNotFound
from shardcache.sources.parquet import arrow_errors

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


GROUPS = 3  # row groups per parquet file with a damaged page, ROWS rows each


def write_parquet_with_damaged_page(path: Path, first_id: int, damaged_group: int) -> str:
    """GROUPS row groups of ids first_id.., the first page of `damaged_group`'s id column overwritten.

    The damaged bytes are found from the footer's offsets and lie inside the column chunk, so the footer
    (and the other row groups) stay readable.
    """
    ids = list(range(first_id, first_id + GROUPS * ROWS))
    pq.write_table(pa.table({"id": ids, "text": [f"row {i}" for i in ids]}), path, row_group_size=ROWS)
    chunk = pq.ParquetFile(path).metadata.row_group(damaged_group).column(0)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(data)
    assert pq.ParquetFile(path).metadata.num_row_groups == GROUPS  # the footer still reads
    return str(path)


def write_parquet_with_bad_utf8(path: Path) -> str:
    """One row group whose third string is not UTF-8: plain pages, uncompressed, so its bytes are found."""
    texts = [f"text-{i}" for i in range(ROWS)]
    pq.write_table(pa.table({"text": texts}), path, compression="none", use_dictionary=False)
    data = path.read_bytes()
    at = data.index(b"text-2")
    path.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    return str(path)


def ids_without_damaged_group(first_id: int, damaged_group: int) -> list[int]:
    return [
        first_id + group * ROWS + i for group in range(GROUPS) if group != damaged_group for i in range(ROWS)
    ]


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


def test_a_damaged_parquet_page_raises_corrupt_shard_naming_the_file_and_row_group(tmp_path: Path) -> None:
    bad = write_parquet_with_damaged_page(tmp_path / "bad.parquet", 0, damaged_group=1)
    with pytest.raises(CorruptShardError, match=r"bad\.parquet at member 'row group 1': OSError: ") as info:
        read_all(Dataset.from_source("parquet", bad, daemon=None))
    assert info.value.shard == bad and info.value.member == "row group 1"


def test_a_damaged_parquet_page_raises_corrupt_shard_through_the_daemon(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    bad = write_parquet_with_damaged_page(tmp_path / "bad.parquet", 0, damaged_group=2)
    with pytest.raises(CorruptShardError, match=r"bad\.parquet at member 'row group 2'"):
        read_all(Dataset.from_source("parquet", bad, daemon=through(daemon_factory, tmp_path)))


def test_parquet_strings_that_are_not_utf8_raise_corrupt_shard_naming_the_row_group(tmp_path: Path) -> None:
    bad = write_parquet_with_bad_utf8(tmp_path / "bad.parquet")
    with pytest.raises(CorruptShardError, match=r"bad\.parquet at member 'row group 0': UnicodeDecodeError"):
        read_all(Dataset.from_source("parquet", bad, daemon=None))


def test_an_os_error_of_the_file_itself_is_not_taken_for_a_damaged_page() -> None:
    # pyarrow passes on what the file object raised; only its own errno-less OSError is damaged data.
    with pytest.raises(OSError, match="Input/output error") as info, arrow_errors("a.parquet", "row group 0"):
        raise OSError(errno.EIO, "Input/output error")
    assert not isinstance(info.value, CorruptShardError)


def test_on_error_skip_skips_only_the_damaged_row_group_logs_it_once_and_counts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = write_parquet(tmp_path / "good.parquet")
    bad = write_parquet_with_damaged_page(tmp_path / "bad.parquet", 100, damaged_group=1)
    ds = Dataset.from_source("parquet", [good, bad], daemon=None, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardcache"):
        ids, skipped = read_all(ds)
    assert sorted(ids) == [*range(ROWS), *ids_without_damaged_group(100, damaged_group=1)]
    assert skipped == 1
    warnings = [r.getMessage() for r in caplog.records if "corrupt shard" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"skipping the rest of row group 1 of corrupt shard {bad} ")


def test_on_error_skip_skips_a_damaged_row_group_through_the_daemon(tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    good = write_parquet(tmp_path / "good.parquet")
    bad = write_parquet_with_damaged_page(tmp_path / "bad.parquet", 100, damaged_group=0)
    client = through(daemon_factory, tmp_path)
    ids, skipped = read_all(Dataset.from_source("parquet", [good, bad], daemon=client, on_error="skip"))
    assert sorted(ids) == [*range(ROWS), *ids_without_damaged_group(100, damaged_group=0)]
    assert skipped == 1


def test_damaged_row_groups_skipped_in_dataloader_workers_reach_the_trainer_and_the_daemon(
    tmp_path: Path, daemon_factory, start_method
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    daemon = daemon_factory(allow=[str(tmp_path)])
    files = [
        write_parquet_with_damaged_page(tmp_path / "a.parquet", 0, damaged_group=1),
        write_parquet_with_damaged_page(tmp_path / "b.parquet", 100, damaged_group=2),
    ]
    ds = Dataset.from_source(
        "parquet", files, daemon=str(daemon.socket), on_error="skip", job="pq-pages", context=RuntimeContext()
    )
    loader = TorchLoader(ds, num_workers=2, multiprocessing_context=worker_context(start_method))
    it = iter(loader)
    ids = sorted(int(s["id"]) for s in it)
    assert ids == [*ids_without_damaged_group(0, 1), *ids_without_damaged_group(100, 2)]
    assert it.skipped_shards == 2
    it.close()
    key = ("shardcache_client_corrupt_samples_total", "pq-pages", "0")
    wait_for(lambda: client_samples(daemon).get(key) == 2, "the daemon to count 2 skipped row groups")


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
