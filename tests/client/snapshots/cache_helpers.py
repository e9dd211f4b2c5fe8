"""Module-level stage functions for the cache tests (lambdas and closures are refused before .cache())."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

OFFSET = 0


def add_length(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "length": len(sample.get("bin", b"")) + OFFSET}


def add_digest(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "digest": hashlib.sha256(sample["bin"]).hexdigest()}


def add_arrays(sample: dict[str, Any]) -> dict[str, Any]:
    import torch

    data = np.frombuffer(sample["bin"], dtype=np.uint8)
    return {
        **sample,
        "array": data.reshape(-1, 4).astype(np.float32),
        "tensor": torch.from_numpy(data.copy()),
    }


def heavy_decode(sample: dict[str, Any]) -> dict[str, Any]:
    """A CPU-heavy map (a stand-in for image decode): iterated hashing of the payload."""
    digest = sample["bin"]
    for _ in range(200):
        digest = hashlib.sha256(digest).digest()
    return {**sample, "feature": digest}


def log_call(sample: dict[str, Any]) -> dict[str, Any]:
    """Append the sample key to $CACHE_TEST_LOG: counts how often each row is computed, across processes."""
    with open(os.environ["CACHE_TEST_LOG"], "a") as f:
        f.write(sample["__key__"] + "\n")
    return sample


def block_at_key(sample: dict[str, Any]) -> dict[str, Any]:
    """Mark $CACHE_TEST_READY and hang on the sample keyed $CACHE_TEST_BLOCK_KEY (to be SIGKILLed there)."""
    if sample["__key__"] == os.environ.get("CACHE_TEST_BLOCK_KEY"):
        Path(os.environ["CACHE_TEST_READY"]).touch()
        threading.Event().wait()
    return sample


def parse_json(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "meta": json.loads(sample["json"])}


class PairUp:
    """An assembler: one sample per two inputs; a leftover is kept unless drop_last."""

    def __init__(self, context: Any) -> None:
        self.pending: list[dict[str, Any]] = []

    def push(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        self.pending.append(sample)
        if len(self.pending) < 2:
            return []
        first, second = self.pending
        self.pending = []
        return [{"__key__": second["__key__"], "keys": [first["__key__"], second["__key__"]]}]

    def finish(self, *, drop_last: bool = False) -> list[dict[str, Any]]:
        left, self.pending = self.pending, []
        if drop_last or not left:
            return []
        return [{"__key__": left[0]["__key__"], "keys": [left[0]["__key__"]]}]


class FakeDeviceMesh:
    """What DataLoadMesh reads of a torch DeviceMesh, for a (dp, tp) mesh without torch.distributed."""

    mesh_dim_names = ("dp", "tp")

    def __init__(self, dp_rank: int, dp_size: int, tp_rank: int, tp_size: int) -> None:
        self._ranks = {"dp": dp_rank, "tp": tp_rank}
        self._sizes = {"dp": dp_size, "tp": tp_size}

    def size(self, mesh_dim: str) -> int:
        return self._sizes[mesh_dim]

    def get_local_rank(self, mesh_dim: str) -> int:
        return self._ranks[mesh_dim]


def assert_same_samples(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> None:
    """Equal field sets, types and values (arrays and tensors compared by dtype, shape and content)."""
    import torch

    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert list(got) == list(want) or set(got) == set(want)
        for name, value in want.items():
            other = got[name]
            assert type(other) is type(value), (name, value, other)
            if isinstance(value, np.ndarray):
                assert other.dtype == value.dtype and other.shape == value.shape
                assert np.array_equal(other, value, equal_nan=value.dtype.kind == "f")
            elif isinstance(value, torch.Tensor):
                assert other.dtype == value.dtype and torch.equal(other, value)
            else:
                assert other == value, name
