"""Epochs advance by themselves (`shardcache.epochs`): each new pass over a Dataset or a TorchLoader reads
the next epoch, in the trainer's process and in a plain DataLoader's workers, unless `set_epoch` pinned one.

A plain DataLoader iterates the dataset in its workers only, so these tests run real DataLoader workers
under torch's default start method (fork on Linux) and under spawn, anew every epoch and persistent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import keys, make_tars

torch_data = pytest.importorskip("torch.utils.data")

from shardcache import Dataset, TorchLoader  # noqa: E402

SHARDS, SAMPLES = 6, 5


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path, SHARDS, SAMPLES)


def dataset(tars: list[str]) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None).shuffle(8)


def epoch_of(tars: list[str], epoch: int) -> list[str]:
    """The samples of `epoch`, read by a fresh dataset pinned to it."""
    ds = dataset(tars)
    ds.set_epoch(epoch)
    return keys(ds)


def key_list(batch: list[dict[str, Any]]) -> list[str]:
    return [str(sample["__key__"]) for sample in batch]


def test_each_new_pass_over_a_dataset_reads_the_next_epoch(tars: list[str]) -> None:
    ds = dataset(tars)
    passes = [keys(ds) for _ in range(3)]
    assert passes == [epoch_of(tars, e) for e in range(3)]
    assert passes[0] != passes[1] != passes[2]
    assert ds.epoch == 3


def test_set_epoch_pins_every_pass_until_set_again(tars: list[str]) -> None:
    ds = dataset(tars)
    ds.set_epoch(4)
    assert keys(ds) == keys(ds) == epoch_of(tars, 4)
    ds.set_epoch(5)
    assert keys(ds) == epoch_of(tars, 5)


def test_a_pass_that_yielded_nothing_does_not_count(tars: list[str]) -> None:
    ds = dataset(tars)
    iter(ds)  # what Lightning does to check that a loader iterates
    assert keys(ds) == epoch_of(tars, 0)


def test_a_pass_abandoned_midway_counts_as_its_epoch(tars: list[str]) -> None:
    ds = dataset(tars)
    iterator = iter(ds)
    next(iterator)
    iterator.close()
    assert keys(ds) == epoch_of(tars, 1)


def test_loading_the_state_of_an_ended_pass_reads_the_epoch_after_it(tars: list[str]) -> None:
    first = dataset(tars)
    iterator = iter(first)
    keys(iterator)
    resumed = dataset(tars)
    resumed.load_state_dict(json.loads(json.dumps(iterator.state_dict())))
    assert keys(resumed) == epoch_of(tars, 1)


def test_a_mid_epoch_state_resumes_its_epoch_and_the_next_pass_reads_the_one_after(tars: list[str]) -> None:
    ds = dataset(tars)
    ds.set_epoch(2)
    keys(ds)
    ds2 = dataset(tars)
    ds2.set_epoch(2)
    iterator = iter(ds2)
    head = [next(iterator)["__key__"] for _ in range(7)]
    resumed = dataset(tars)
    resumed.load_state_dict(iterator.state_dict())
    assert head + keys(resumed) == epoch_of(tars, 2)
    assert keys(resumed) == epoch_of(tars, 3)


@pytest.mark.parametrize("persistent", [False, True], ids=["workers-per-epoch", "persistent-workers"])
@pytest.mark.parametrize("method", [None, "spawn"], ids=["default-start", "spawn"])
def test_a_plain_dataloader_reads_a_new_epoch_every_pass(
    tars: list[str], method: str | None, persistent: bool
) -> None:
    ds = dataset(tars)
    loader = torch_data.DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=persistent,
        collate_fn=None,
    )
    passes = [sorted(keys(loader)) for _ in range(3)]
    assert passes[0] == passes[1] == passes[2] == sorted(epoch_of(tars, 0))
    by_worker_order = [keys(loader) for _ in range(2)]
    assert by_worker_order[0] != by_worker_order[1]


def test_set_epoch_reaches_persistent_dataloader_workers(tars: list[str]) -> None:
    ds = dataset(tars)
    loader = torch_data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    keys(loader)
    ds.set_epoch(7)
    pinned = [keys(loader) for _ in range(2)]
    ds.set_epoch(7)
    again = torch_data.DataLoader(ds, batch_size=None, num_workers=2)
    assert pinned[0] == pinned[1] == keys(again)


def test_each_new_pass_over_a_torch_loader_reads_the_next_epoch(tars: list[str]) -> None:
    loader = TorchLoader(dataset(tars), num_workers=2, batch_size=4, collate_fn=key_list)
    try:
        passes = [[k for batch in loader for k in batch] for _ in range(3)]
        states = loader.state_dict()
    finally:
        loader.close()
    assert len({tuple(p) for p in passes}) == 3
    assert all(sorted(p) == sorted(passes[0]) for p in passes)
    assert states["end"]["epoch"] == 2


def test_a_torch_loader_state_names_the_position_before_items_fetched_ahead(tars: list[str]) -> None:
    def make() -> TorchLoader:
        return TorchLoader(dataset(tars), num_workers=2, batch_size=4, collate_fn=key_list)

    loader = make()
    fetched = [0]
    loader.checkpoint_with(lambda: fetched[0], keep=1, scope="rank")
    try:
        iterator = iter(loader)
        trained = [next(iterator) for _ in range(3)]
        next(iterator)  # the framework's look-ahead: fetched, not trained on
        fetched[0] = 1
        state = json.loads(json.dumps(loader.state_dict()))
        whole = trained
    finally:
        loader.close()
    resumed = make()
    try:
        resumed.load_state_dict(state)
        rest = list(resumed)
    finally:
        resumed.close()
    fresh = make()
    try:
        full = list(fresh)
    finally:
        fresh.close()
    assert whole + rest == full


def test_a_job_state_without_torch_distributed_is_the_rank_s_own(tars: list[str]) -> None:
    loader = TorchLoader(dataset(tars), num_workers=0, batch_size=4, collate_fn=key_list, state_scope="job")
    iterator = iter(loader)
    next(iterator)
    assert loader.state_dict() == iterator.state_dict()


def test_an_unknown_state_scope_is_refused(tars: list[str]) -> None:
    with pytest.raises(ValueError, match="state_scope='world'"):
        TorchLoader(dataset(tars), state_scope="world")
