"""TorchLoader's persistent workers: one set of DataLoader workers serves every epoch of a loader.

With workers, `persistent_workers` defaults to True: the workers start once and each epoch's order (the
epoch, resume states, exhausted workers) reaches them through the loader's run directory. What they yield
must be exactly what workers restarted every epoch yield. Workers start with torch's default method (fork on
Linux, what users get); one test repeats the epochs under forkserver, where the pipeline is pickled.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.pipelines import make_tars
from harness.polling import wait_for
from harness.start_methods import worker_context

pytest.importorskip("torch.utils.data")

from shardcache import Dataset, TorchLoader  # noqa: E402

NUM_WORKERS = 2
SHARDS, SAMPLES = 8, 4
ALL_KEYS = sorted(f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(SAMPLES))
# Workers stop within torch's own shutdown timeouts; this only bounds a test that would otherwise hang.
DEADLINE_S = 30.0


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def key_and_pid(sample: dict[str, Any]) -> tuple[str, int]:
    """Which worker process produced the sample (runs in the worker)."""
    return str(sample["__key__"]), os.getpid()


def identity(batch: list[Any]) -> list[Any]:
    return batch


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=SHARDS, samples=SAMPLES)


@pytest.fixture
def run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary directory, where this test's loaders make their run directories."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def keyed(tars: list[str]) -> Dataset:
    """A dataset whose order changes with the epoch (shard deal and a worker-side shuffle)."""
    return Dataset.from_source("tars", tars, daemon=None).shuffle(8).map(key_of)


def pid_tagged(tars: list[str]) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None).shuffle(8).map(key_and_pid)


def epochs(loader: TorchLoader, count: int = 3) -> list[list[Any]]:
    """Every item of epochs 0..count-1, iterated on the same loader."""
    out = []
    for epoch in range(count):
        loader.set_epoch(epoch)
        out.append(list(loader))
    return out


def fresh_epoch(make: Callable[[], TorchLoader], epoch: int) -> list[Any]:
    """One epoch of a new loader (its own workers), closed afterwards."""
    loader = make()
    try:
        loader.set_epoch(epoch)
        return list(loader)
    finally:
        loader.close()


def pids_of(items: list[tuple[str, int]]) -> set[int]:
    return {pid for _, pid in items}


def all_gone(pids: set[int]) -> Callable[[], bool]:
    return lambda: not any(psutil.pid_exists(pid) for pid in pids)


def test_persistent_workers_are_the_default_and_keep_their_processes_across_epochs(tars: list[str]) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        runs = epochs(loader)
    finally:
        loader.close()
    assert loader.persistent_workers
    first = pids_of(runs[0])
    assert len(first) == NUM_WORKERS and os.getpid() not in first
    assert [pids_of(run) for run in runs] == [first] * 3


def test_restarted_workers_are_new_processes_every_epoch(tars: list[str]) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS, persistent_workers=False)
    try:
        runs = epochs(loader)
    finally:
        loader.close()
    assert not loader.persistent_workers
    seen = [pids_of(run) for run in runs]
    assert all(len(pids) == NUM_WORKERS for pids in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_persistent_workers_yield_each_epoch_exactly_as_restarted_workers(tars: list[str]) -> None:
    persistent = TorchLoader(keyed(tars), num_workers=NUM_WORKERS)
    restarted = TorchLoader(keyed(tars), num_workers=NUM_WORKERS, persistent_workers=False)
    try:
        assert epochs(persistent) == epochs(restarted)
    finally:
        persistent.close()
        restarted.close()


def test_set_epoch_reaches_persistent_workers(tars: list[str]) -> None:
    loader = TorchLoader(keyed(tars), num_workers=NUM_WORKERS)
    try:
        runs = epochs(loader)
    finally:
        loader.close()
    assert all(sorted(run) == ALL_KEYS for run in runs), "every epoch is whole, nothing repeated"
    assert runs[0] != runs[1] and runs[1] != runs[2] and runs[0] != runs[2]
    for epoch, run in enumerate(runs):
        assert run == fresh_epoch(lambda: TorchLoader(keyed(tars), num_workers=NUM_WORKERS), epoch)


def test_an_epoch_left_unfinished_does_not_leak_into_the_next(tars: list[str]) -> None:
    def make() -> TorchLoader:
        return TorchLoader(keyed(tars), num_workers=NUM_WORKERS)

    loader = make()
    try:
        loader.set_epoch(0)
        for step, _ in enumerate(loader):
            if step == 4:
                break
        loader.set_epoch(1)
        next_epoch = list(loader)
        loader.set_epoch(0)
        same_epoch_again = list(loader)
    finally:
        loader.close()
    assert next_epoch == fresh_epoch(make, 1)
    assert same_epoch_again == fresh_epoch(make, 0)


# -- resume states ---------------------------------------------------------------------------------------


def samples(tars: list[str]) -> TorchLoader:
    return TorchLoader(keyed(tars), num_workers=NUM_WORKERS)


def worker_batches(tars: list[str]) -> TorchLoader:
    return TorchLoader(keyed(tars), num_workers=NUM_WORKERS, batch_size=3, collate_fn=identity)


def loader_side_chain(tars: list[str]) -> TorchLoader:
    return worker_batches(tars).unbatch().shuffle(6, seed=1).batch(4)


LAYOUTS = {"samples": samples, "worker_batches": worker_batches, "loader_side_chain": loader_side_chain}


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a checkpoint stores it."""
    loaded: dict[str, Any] = json.loads(json.dumps(state))
    return loaded


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("consumed", [1, 5])
def test_a_resume_state_reaches_the_persistent_workers_of_the_same_loader(
    tars: list[str], layout: str, consumed: int
) -> None:
    make = functools.partial(LAYOUTS[layout], tars)
    full = fresh_epoch(make, 1)
    loader = make()
    try:
        loader.set_epoch(1)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(consumed)]
        state = round_trip(loader.state_dict())
        loader.load_state_dict(state)
        tail = list(loader)
    finally:
        loader.close()
    assert head + tail == full
    fresh = make()
    try:
        fresh.load_state_dict(state)
        assert list(fresh) == full[consumed:], "the same state resumes a fresh loader identically"
    finally:
        fresh.close()


def test_a_resume_state_reaches_persistent_workers_after_whole_epochs(tars: list[str]) -> None:
    def make() -> TorchLoader:
        return samples(tars)

    full = fresh_epoch(make, 2)
    loader = make()
    try:
        epochs(loader, 2)  # the workers are live and have served two epochs
        loader.set_epoch(2)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(7)]
        state = round_trip(loader.state_dict())
        del iterator
        loader.set_epoch(0)  # the state carries its own epoch
        loader.load_state_dict(state)
        tail = list(loader)
    finally:
        loader.close()
    assert head + tail == full


# -- stopping the workers --------------------------------------------------------------------------------


def started_workers(loader: TorchLoader) -> tuple[Iterator[tuple[str, int]], set[int]]:
    """An iteration of `loader` that has items from every worker, and the workers' pids."""
    iterator = iter(loader)
    pids = {next(iterator)[1] for _ in range(NUM_WORKERS)}  # the merge takes the workers in rotation
    assert len(pids) == NUM_WORKERS
    return iterator, pids


def test_workers_outlive_an_epoch_and_close_stops_them_and_removes_the_run_directory(
    tars: list[str], run_dirs: Path
) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        pids = pids_of(list(loader))
        assert all(psutil.pid_exists(pid) for pid in pids), "persistent workers wait for the next epoch"
        assert len(list(run_dirs.glob("shardcache-loader-*"))) == 1
    finally:
        loader.close()
    wait_for(all_gone(pids), "the closed loader's workers to exit", DEADLINE_S)
    assert list(run_dirs.iterdir()) == []


def test_close_during_an_epoch_stops_the_workers(tars: list[str], run_dirs: Path) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        _iterator, pids = started_workers(loader)
    finally:
        loader.close()
    wait_for(all_gone(pids), "the closed loader's workers to exit", DEADLINE_S)
    assert list(run_dirs.iterdir()) == []


def test_a_closed_loader_starts_new_workers_at_its_next_epoch(tars: list[str]) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        loader.set_epoch(0)
        before = list(loader)
        loader.close()
        loader.set_epoch(1)
        after = list(loader)
    finally:
        loader.close()
    assert [key for key, _ in after] == fresh_epoch(
        lambda: TorchLoader(keyed(tars), num_workers=NUM_WORKERS), 1
    )
    assert not pids_of(before) & pids_of(after)


def test_state_dict_after_close_resumes_where_the_closed_iteration_stopped(tars: list[str]) -> None:
    def make() -> TorchLoader:
        return loader_side_chain(tars)

    full = fresh_epoch(make, 0)
    loader = make()
    try:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        loader.close()
        state = round_trip(loader.state_dict())
        again = list(loader)
    finally:
        loader.close()
    assert again == fresh_epoch(make, 1), "a pass closed midway counts: the next one reads the next epoch"
    fresh = make()
    try:
        fresh.load_state_dict(state)
        assert head + list(fresh) == full
    finally:
        fresh.close()


def test_dropping_the_loader_and_its_iterator_stops_the_workers(tars: list[str], run_dirs: Path) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        iterator, pids = started_workers(loader)
    except BaseException:
        loader.close()
        raise
    del iterator, loader
    gc.collect()
    wait_for(all_gone(pids), "the dropped loader's workers to exit", DEADLINE_S)
    assert list(run_dirs.iterdir()) == []


def test_dropping_a_loader_after_whole_epochs_stops_the_workers(tars: list[str], run_dirs: Path) -> None:
    loader = TorchLoader(pid_tagged(tars), num_workers=NUM_WORKERS)
    try:
        pids = set().union(*(pids_of(run) for run in epochs(loader, 2)))
    except BaseException:
        loader.close()
        raise
    del loader
    gc.collect()
    wait_for(all_gone(pids), "the dropped loader's workers to exit", DEADLINE_S)
    assert list(run_dirs.iterdir()) == []


# -- without workers, and under forkserver ---------------------------------------------------------------


def test_worker_only_arguments_are_ignored_without_workers(tars: list[str], run_dirs: Path) -> None:
    plain = TorchLoader(keyed(tars))
    loader = TorchLoader(
        keyed(tars), prefetch_factor=2, persistent_workers=True, multiprocessing_context="spawn"
    )
    assert not loader.persistent_workers
    for epoch in range(2):
        plain.set_epoch(epoch)
        loader.set_epoch(epoch)
        run = list(loader)
        assert sorted(run) == ALL_KEYS
        assert run == list(plain)
    assert list(run_dirs.iterdir()) == [], "no workers, no run directory"


def test_persistent_forkserver_workers_get_each_epochs_order(tars: list[str]) -> None:
    loader = TorchLoader(
        pid_tagged(tars), num_workers=NUM_WORKERS, multiprocessing_context=worker_context("forkserver")
    )
    try:
        runs = epochs(loader)
    finally:
        loader.close()
    assert [pids_of(run) for run in runs] == [pids_of(runs[0])] * 3
    for epoch, run in enumerate(runs):
        expected = fresh_epoch(lambda: TorchLoader(keyed(tars), num_workers=NUM_WORKERS), epoch)
        assert [key for key, _ in run] == expected
