"""TorchLoader state (issue 6): merge order, size, epoch, refusals. Exact resume: test_resume_contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from harness.start_methods import DEFAULT, loader_workers

pytest.importorskip("torch.utils.data")

from shardcache import Dataset, RuntimeContext, StateError, TorchLoader  # noqa: E402


def identity(batch: list[Any]) -> list[Any]:
    return batch


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=4, samples=5)


def loader(
    tars: list[str],
    workers: int,
    context: RuntimeContext | None = None,
    method: str = DEFAULT,
    **kwargs: Any,
) -> TorchLoader:
    ds = Dataset.from_source("tars", tars, daemon=None, context=context).map(key_of)
    if workers:
        kwargs = {**loader_workers(method), **kwargs}
    return TorchLoader(ds, num_workers=workers, batch_size=3, collate_fn=identity, **kwargs)


def test_merge_order_does_not_depend_on_dataloader_delivery_order(tars: list[str], start_method: str) -> None:
    # in_order=False lets the DataLoader hand over whichever worker is ready first; the merge reorders.
    reference = list(loader(tars, 2, method=start_method))
    assert list(loader(tars, 2, method=start_method, in_order=False)) == reference
    assert sorted(k for batch in reference for k in batch) == sorted(
        f"s{s:03d}_{i:04d}" for s in range(4) for i in range(5)
    )


def test_state_is_small_json_without_sample_data(tars: list[str], loader_mode: str) -> None:
    it = iter(loader(tars, 2, method=loader_mode).unbatch().shuffle(6, seed=1))
    seen = [next(it) for _ in range(7)]
    text = json.dumps(it.state_dict())
    assert len(text) < 2000
    assert not any(key in text for key in seen)


def test_resume_continues_the_epoch_of_the_state(tars: list[str], loader_mode: str) -> None:
    first = loader(tars, 2, method=loader_mode)
    first.set_epoch(3)
    it = iter(first)
    head = [next(it) for _ in range(2)]
    resumed = loader(tars, 2, method=loader_mode)  # no set_epoch: the state's epoch wins
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    reference = loader(tars, 2, method=loader_mode)
    reference.set_epoch(3)
    assert head + list(resumed) == list(reference)


def test_state_from_other_num_workers_is_refused(tars: list[str], loader_mode: str) -> None:
    it = iter(loader(tars, 2, method=loader_mode))
    next(it)
    with pytest.raises(StateError, match="num_workers=2.*num_workers=0"):
        loader(tars, 0).load_state_dict(it.state_dict())


def test_state_from_world_size_2_is_refused_under_world_size_4(tars: list[str]) -> None:
    it = iter(loader(tars, 0, RuntimeContext(rank=0, world_size=2)))
    next(it)
    with pytest.raises(StateError, match="rank 0 of 2.*rank 0 of 4.*same world size"):
        loader(tars, 0, RuntimeContext(rank=0, world_size=4)).load_state_dict(it.state_dict())


def test_state_of_other_loader_side_stages_is_refused(tars: list[str]) -> None:
    it = iter(loader(tars, 0).unbatch())
    next(it)
    with pytest.raises(StateError, match="another dataset, batching or stage list"):
        loader(tars, 0).unbatch().shuffle(4).load_state_dict(it.state_dict())


def test_dataset_state_is_refused_by_a_loader(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    next(iter(ds))
    with pytest.raises(StateError, match="not taken from a TorchLoader"):
        loader(tars, 0).load_state_dict(ds.state_dict())


def test_state_dict_before_iterating_is_the_initial_state(tars: list[str]) -> None:
    # mvp-dataset's contract: before any iteration the state says "start from the beginning".
    state = loader(tars, 0).state_dict()
    assert state["state"] is None
    resumed = loader(tars, 0)
    resumed.load_state_dict(state)
    assert list(resumed) == list(loader(tars, 0))
