"""TorchLoader forks its workers with the trainer's objects in the collector's permanent generation, so a
worker's garbage collections never write to (and copy) the pages it shares with the trainer
(`shardcache.loader.fork_memory`)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from harness.start_methods import worker_context

pytest.importorskip("torch.utils.data")

from shardcache import Dataset, RuntimeContext, TorchLoader  # noqa: E402
from shardcache.loader.fork_memory import frozen_for_fork  # noqa: E402


def frozen_count(sample: dict[str, Any]) -> dict[str, Any]:
    return {"frozen": gc.get_freeze_count()}


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    tars = make_tars(tmp_path / "tars", count=4, samples=2)
    ctx = RuntimeContext(rank=0, world_size=1, seed=0)
    return Dataset.from_source("tars", tars, daemon=None, context=ctx).map(frozen_count)


def test_a_forked_worker_starts_with_the_trainers_objects_frozen(dataset: Dataset) -> None:
    loader = TorchLoader(dataset, num_workers=2, persistent_workers=False)
    frozen = {sample["frozen"] for sample in loader}
    assert min(frozen) > 0


def test_the_trainers_collector_is_as_before_after_the_fork(dataset: Dataset) -> None:
    loader = TorchLoader(dataset, num_workers=2)
    assert next(iter(loader)) is not None
    assert gc.get_freeze_count() == 0
    loader.close()


def test_workers_of_other_start_methods_read_as_before(dataset: Dataset) -> None:
    loader = TorchLoader(
        dataset, num_workers=2, persistent_workers=False, multiprocessing_context=worker_context("forkserver")
    )
    assert len(list(loader)) == 8
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen() -> None:
    gc.freeze()
    try:
        with frozen_for_fork():
            pass
        assert gc.get_freeze_count() > 0  # not unfrozen behind the process's back
    finally:
        gc.unfreeze()
