"""TorchLoader and plain DataLoader over a Dataset, with real worker processes (seed README, TorchLoader)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import FakeDeviceMesh, make_tars
from harness.start_methods import loader_workers, worker_context

torch_data = pytest.importorskip("torch.utils.data")

from shardcache import Dataset, RuntimeContext, TorchLoader  # noqa: E402


def identity(batch: list[Any]) -> list[Any]:
    return batch


class Pairs:
    def __init__(self, context: RuntimeContext) -> None:
        self.pending: list[str] = []

    def push(self, sample: dict[str, Any]) -> list[tuple[str, ...]]:
        self.pending.append(sample["__key__"])
        if len(self.pending) < 2:
            return []
        out, self.pending = tuple(self.pending), []
        return [out]

    def finish(self, *, drop_last: bool = False) -> list[tuple[str, ...]]:
        return [tuple(self.pending)] if self.pending and not drop_last else []


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=4, samples=5)


def test_dataset_is_an_iterable_dataset_for_a_plain_dataloader(
    tars: list[str], any_start_method: str
) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    assert isinstance(ds, torch_data.IterableDataset)
    loader = torch_data.DataLoader(
        ds, num_workers=2, batch_size=None, multiprocessing_context=worker_context(any_start_method)
    )
    seen = Counter(s["__key__"] for s in loader)
    assert len(seen) == 20 and set(seen.values()) == {1}


def test_worker_batches_unbatch_shuffle_assemble_batch(tars: list[str], loader_mode: str) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    loader = (
        TorchLoader(ds, num_workers=2, batch_size=3, collate_fn=identity, **loader_workers(loader_mode))
        .unbatch()
        .shuffle(buffer_size=6, seed=1)
        .assemble(Pairs)
        .batch(batch_size=4)
    )
    batches = list(loader)
    packed = [pair for batch in batches for pair in batch]
    flat = [key for pair in packed for key in pair]
    assert sorted(flat) == sorted(f"s{s:03d}_{i:04d}" for s in range(4) for i in range(5))
    assert [len(b) for b in batches] == [4, 4, 2]
    loader.set_epoch(0)
    assert flat == [k for b in loader for pair in b for k in pair]  # deterministic across runs of an epoch


def test_loader_shuffle_is_aligned_for_tp_co_members(tars: list[str], loader_mode: str) -> None:
    def run(tp: int) -> list[str]:
        mesh = FakeDeviceMesh({"dp": 1, "tp": 2}, {"dp": 0, "tp": tp})
        ctx = RuntimeContext.from_runtime(
            device_mesh=mesh, dp_dims="dp", env={"RANK": str(tp), "WORLD_SIZE": "2"}
        )
        ds = Dataset.from_source("tars", tars, daemon=None, context=ctx)
        loader = (
            TorchLoader(ds, num_workers=2, batch_size=2, collate_fn=identity, **loader_workers(loader_mode))
            .unbatch()
            .shuffle(8)
        )
        return [s["__key__"] for s in loader]

    first = run(0)
    assert first == run(1)
    assert len(first) == len(set(first)) == 20


def test_explicit_context_counts_dataloader_workers(tars: list[str], loader_mode: str) -> None:
    ctx = RuntimeContext(rank=1, world_size=2)
    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx)
    workers = loader_workers(loader_mode)
    got = [s["__key__"] for s in TorchLoader(ds, num_workers=2, **workers)]
    other = Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(rank=0, world_size=2))
    rest = [s["__key__"] for s in TorchLoader(other, num_workers=2, **workers)]
    assert len(got) == len(rest) == 10  # 2 ranks x 2 workers = 4 slots, one shard of 5 each
    assert len(set(got) | set(rest)) == 20


# -- mvp-dataset 0.2.3: sample mode keeps samples as they are, plain iterables ------------------------------


def as_array(sample: dict[str, Any]) -> Any:
    import numpy as np

    return np.array(list(sample["__key__"].encode()), dtype=np.uint8)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sample_mode_without_collate_fn_keeps_numpy_arrays(
    tars: list[str], loader_mode: str, num_workers: int
) -> None:
    import numpy as np

    ds = Dataset.from_source("tars", tars, daemon=None).map(as_array)
    items = list(TorchLoader(ds, num_workers=num_workers, **loader_workers(loader_mode)))
    assert len(items) == 20 and all(type(item) is np.ndarray for item in items)


def test_worker_batches_without_collate_fn_still_use_default_collate(tars: list[str]) -> None:
    import torch

    ds = Dataset.from_source("tars", tars, daemon=None).map(as_array)
    batches = list(TorchLoader(ds, batch_size=4))
    assert len(batches) == 5 and all(isinstance(b, torch.Tensor) and b.shape[0] == 4 for b in batches)


class Epochs:
    """A plain iterable with set_epoch: yields (epoch, i)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        return iter([(self.epoch, i) for i in range(3)])


def test_a_plain_iterable_passes_through_the_loader_and_its_stages() -> None:
    import numpy as np

    assert list(TorchLoader([1, 2, 3])) == [1, 2, 3]
    assert list(TorchLoader(range(5), batch_size=2, collate_fn=identity).unbatch().batch(3)) == [
        [0, 1, 2],
        [3, 4],
    ]
    assert list(TorchLoader(x for x in (4, 5)).map(lambda x: x * 2)) == [8, 10]
    (array,) = TorchLoader([np.arange(3)])
    assert type(array) is np.ndarray
    loader = TorchLoader(Epochs())
    loader.set_epoch(2)
    assert list(loader) == [(2, 0), (2, 1), (2, 2)]


def test_every_worker_iterates_all_of_a_plain_iterable(start_method: str) -> None:
    loader = TorchLoader(list(range(4)), num_workers=2, multiprocessing_context=worker_context(start_method))
    assert Counter(loader) == {i: 2 for i in range(4)}


def test_a_plain_iterable_does_not_resume() -> None:
    from shardcache import UnsupportedResume

    loader = TorchLoader([1, 2, 3]).shuffle(2)
    it = iter(loader)
    next(it)
    for call in (loader.state_dict, it.state_dict, loader.fingerprint, lambda: loader.load_state_dict({})):
        with pytest.raises(UnsupportedResume, match="only a shardcache.Dataset resumes"):
            call()


def test_set_epoch_needs_a_dataset_that_has_one() -> None:
    from shardcache import ConfigError

    with pytest.raises(ConfigError, match="set_epoch"):
        TorchLoader([1, 2]).set_epoch(1)
