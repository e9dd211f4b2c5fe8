"""A shardcache error raised in a DataLoader worker reaches the trainer with its type.

torch re-raises a worker's exception as `type(exc)(message)`, and as a RuntimeError when that call fails:
before, every shardcache error whose constructor takes more than a message (CorruptShardError,
ShardNotFound, ...) arrived as a RuntimeError, so `except CorruptShardError` in a training loop missed it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardcache import Dataset, TorchLoader
from shardcache.errors import CorruptShardError, RemoteNotFound, ShardNotFound


@pytest.fixture
def corrupt_jsonl(tmp_path: Path) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    return str(path)


def test_a_corrupt_shard_in_a_torchloader_worker_raises_corrupt_shard_error(corrupt_jsonl: str) -> None:
    loader = TorchLoader(Dataset.from_source("jsonl", [corrupt_jsonl], daemon=None), num_workers=1)
    with pytest.raises(CorruptShardError, match="bad.jsonl"):
        list(loader)


def test_a_corrupt_shard_in_a_plain_dataloader_worker_raises_corrupt_shard_error(corrupt_jsonl: str) -> None:
    dataset: Any = Dataset.from_source("jsonl", [corrupt_jsonl], daemon=None)  # an IterableDataset to torch
    loader: DataLoader[Any] = DataLoader(dataset, num_workers=1)
    with pytest.raises(CorruptShardError, match="bad.jsonl"):
        list(loader)


def test_a_missing_shard_in_a_worker_raises_shard_not_found(tmp_path: Path) -> None:
    shard = tmp_path / "gone.jsonl"
    shard.write_text('{"a": 1}\n')
    loader = TorchLoader(Dataset.from_source("jsonl", [str(shard)], daemon=None), num_workers=1)
    shard.unlink()  # removed after the dataset listed it: found missing when a worker opens it
    with pytest.raises(ShardNotFound, match="gone.jsonl") as raised:
        list(loader)
    assert isinstance(raised.value, RemoteNotFound) and isinstance(raised.value, FileNotFoundError)


def test_an_error_rebuilt_from_its_message_alone_has_its_fields_none() -> None:
    rebuild: Any = CorruptShardError  # as torch does: type(exc)(message)
    rebuilt = rebuild("corrupt shard s3://b/x.tar: truncated")
    assert isinstance(rebuilt, CorruptShardError)
    assert str(rebuilt) == "corrupt shard s3://b/x.tar: truncated"
    assert [rebuilt.shard, rebuilt.detail, rebuilt.member, rebuilt.line] == [None, None, None, None]
    assert CorruptShardError("s3://b/x.tar", "truncated").shard == "s3://b/x.tar"
