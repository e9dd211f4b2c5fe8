"""A client that finds a shard corrupt through the daemon tells it; the daemon compares its copy with the
remote at once and refetches a shard fixed there, and the error says which happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.shards import make_tar_shard
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import CorruptShardError

SAMPLES = 4


def write_truncated(path: Path) -> None:
    make_tar_shard(path, 0, SAMPLES, payload_bytes=2048)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def keys(url: str, client: DaemonClient) -> list[str]:
    ds = Dataset.from_source("tars", [url], daemon=client)
    return [s["__key__"] for s in ds.iter_context(RuntimeContext())]


def test_a_shard_fixed_on_the_remote_is_read_through_the_daemon_right_after_it_was_found_corrupt(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    shard = tmp_path / "shard_000000.tar"
    write_truncated(shard)
    client = DaemonClient(str(daemon_factory(allow=[str(tmp_path)]).socket), required=True)
    with pytest.raises(CorruptShardError):
        keys(str(shard), client)
    make_tar_shard(shard, 0, SAMPLES, payload_bytes=2048)  # fixed at the remote
    assert len(keys(str(shard), client)) == SAMPLES


def test_a_corrupt_shard_the_remote_still_holds_says_to_re_create_it_at_the_remote(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    shard = tmp_path / "shard_000000.tar"
    write_truncated(shard)
    client = DaemonClient(str(daemon_factory(allow=[str(tmp_path)]).socket), required=True)
    with pytest.raises(
        CorruptShardError, match="copy is the remote.s current version: re-create the shard at the remote"
    ):
        keys(str(shard), client)
    assert client.revalidate(str(shard)).changed is False
