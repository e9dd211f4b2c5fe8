"""Worker processes hand their batches over through a shared-memory ring (`shardcache.loader.ring`).

What must hold: the training loop sees exactly the batches torch's own path gives, whether it drops each
batch at once or keeps them all (a slot it still holds is never written again), across epochs of persistent
workers and under every start method; and a slot is the worker's again once the trainer dropped the batch.
"""

from __future__ import annotations

import gc
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.pipelines import make_tars
from harness.start_methods import worker_context

torch = pytest.importorskip("torch")

from shardcache import Dataset, TorchLoader  # noqa: E402
from shardcache.loader.ring import SLOTS, RingBatch, RingReader, RingWriter  # noqa: E402

Pair = namedtuple("Pair", ["key", "values"])


def arrays(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample of every kind of leaf: a tensor, a numpy array of another dtype, a string, an int."""
    key = str(sample["__key__"])
    seed = sum(key.encode())
    return {
        "key": key,
        "index": int(key[-4:]),
        "pixels": np.random.default_rng(seed).integers(0, 255, (4, 8, 3), dtype=np.uint8),
        "weights": torch.arange(4, dtype=torch.bfloat16) + seed % 7,
    }


def as_lists(batch: list[dict[str, Any]]) -> list[Pair]:
    return [Pair(s["key"], (s["pixels"], s["weights"])) for s in batch]


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=4, samples=9)


def plain(value: Any) -> Any:
    """A batch as comparable Python values."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.float().tolist())
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def epochs(tars: list[str], ring: bool, method: str, hold: bool, **kwargs: Any) -> list[Any]:
    """Two epochs of a loader of persistent workers; `hold`: keep every batch until the end."""
    ds = Dataset.from_source("tars", tars, daemon=None).map(arrays)
    loader = TorchLoader(
        ds, num_workers=2, shared_ring=ring, multiprocessing_context=worker_context(method), **kwargs
    )
    held, seen = [], []
    try:
        for _ in range(2):
            for batch in loader:
                if hold:
                    held.append(batch)
                else:
                    seen.append(plain(batch))
    finally:
        loader.close()
    return [plain(batch) for batch in held] if hold else seen


@pytest.mark.parametrize("hold", [False, True], ids=["dropped", "held"])
def test_the_ring_gives_the_batches_of_torchs_own_path(
    tars: list[str], start_method: str, hold: bool
) -> None:
    expected = epochs(tars, False, start_method, hold=False, batch_size=4)
    assert epochs(tars, True, start_method, hold=hold, batch_size=4) == expected


def test_the_ring_keeps_a_custom_collates_structure(tars: list[str]) -> None:
    expected = epochs(tars, False, "default", hold=False, batch_size=3, collate_fn=as_lists)
    assert epochs(tars, True, "default", hold=True, batch_size=3, collate_fn=as_lists) == expected


def test_samples_without_a_batch_size_cross_the_ring_too(tars: list[str]) -> None:
    assert epochs(tars, True, "default", hold=True) == epochs(tars, False, "default", hold=False)


# -- the ring itself, in one process -------------------------------------------------------------------------


def batch(value: int, size: int = 16) -> dict[str, Any]:
    return {"x": torch.full((size,), value, dtype=torch.int64), "y": np.full(3, value, dtype=np.float32)}


def test_a_packed_batch_unpacks_to_equal_tensors_and_arrays() -> None:
    writer, reader = RingWriter(), RingReader()
    packed = writer.pack(batch(7))
    assert isinstance(packed, RingBatch)
    got = reader.unpack(packed)
    assert isinstance(got, dict)
    assert torch.equal(got["x"], batch(7)["x"]) and np.array_equal(got["y"], batch(7)["y"])


def test_a_slot_is_free_again_once_the_trainer_dropped_its_batch() -> None:
    writer, reader = RingWriter(), RingReader()
    held: list[Any] = [reader.unpack(writer.pack(batch(i))) for i in range(SLOTS)]
    assert not isinstance(writer.pack(batch(99)), RingBatch), "every slot held: torch's own path"
    assert [int(b["x"][0]) for b in held] == list(range(SLOTS)), "no held slot was written again"
    view = held.pop(2)["x"][3:5]  # a view of a batch keeps its slot
    gc.collect()
    assert not isinstance(writer.pack(batch(99)), RingBatch)
    del view
    assert isinstance(writer.pack(batch(5)), RingBatch)


def test_a_batch_larger_than_a_slot_gets_a_larger_segment() -> None:
    writer, reader = RingWriter(), RingReader()
    small = reader.unpack(writer.pack(batch(1, size=4)))
    larger = writer.pack(batch(2, size=4096))
    assert isinstance(larger, RingBatch) and larger.segment is not None, "a new segment, sent once"
    got = reader.unpack(larger)
    assert isinstance(got, dict) and int(got["x"].sum()) == 2 * 4096
    assert isinstance(small, dict) and int(small["x"].sum()) == 4, "the older batch keeps its own segment"


def test_the_segment_travels_with_each_batch_until_the_trainer_has_it() -> None:
    writer, reader = RingWriter(), RingReader()
    writer.pack(batch(1))  # dropped in flight: the trainer never saw it
    second = writer.pack(batch(2))
    assert isinstance(second, RingBatch) and second.segment is not None
    got: Any = reader.unpack(second)
    assert int(got["x"][0]) == 2
    third = writer.pack(batch(3))
    assert isinstance(third, RingBatch) and third.segment is None


def test_a_new_pass_takes_back_the_slots_of_batches_dropped_in_flight() -> None:
    writer = RingWriter()
    for i in range(SLOTS):
        writer.pack(batch(i))  # none reaches the trainer
    assert not isinstance(writer.pack(batch(9)), RingBatch)
    writer.reclaim()
    assert isinstance(writer.pack(batch(9)), RingBatch)


def test_a_pass_left_early_leaves_the_next_passes_whole(tars: list[str]) -> None:
    def passes(ring: bool) -> list[Any]:
        ds = Dataset.from_source("tars", tars, daemon=None).map(arrays)
        loader = TorchLoader(ds, num_workers=2, batch_size=2, shared_ring=ring)
        seen = []
        try:
            for epoch in range(4):
                loader.set_epoch(epoch)
                for step, item in enumerate(loader):
                    seen.append(plain(item))
                    if epoch % 2 == 0 and step == 1:
                        break  # batches in flight are dropped by the DataLoader
        finally:
            loader.close()
        return seen

    assert passes(True) == passes(False)
