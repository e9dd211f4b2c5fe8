"""Iteration reports trainer telemetry by itself: wait time, samples and skipped shards per (job, slot)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.daemon_api import client_samples
from harness.devservers import Daemon
from harness.start_methods import worker_context
from shardcache import Dataset, RuntimeContext, TorchLoader
from shardcache.pipeline.iteration import PipelineIterator


def reported(daemon: Daemon, name: str, job: str, expected: float) -> float | None:
    """The daemon's `name` series for (job, slot 0) once it reaches `expected` (polled with a deadline)."""
    deadline = time.monotonic() + 20
    while True:
        value = client_samples(daemon).get((name, job, "0"))
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.05)  # the last report leaves from the background thread


def test_a_dataset_iterated_in_the_trainer_reports_its_samples_and_wait(local_shards, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="auto-ds")
    it = iter(ds)
    assert isinstance(it, PipelineIterator)  # Dataset.__iter__ is typed as a plain Iterator
    assert len(list(it)) == 4 * 8
    assert it.telemetry is not None
    waited = it.telemetry.waited_s
    it.close()  # the last figures are sent when the iteration is released
    assert reported(daemon, "shardcache_client_samples_total", "auto-ds", 4 * 8) == 4 * 8
    wait = client_samples(daemon)[("shardcache_client_wait_seconds_total", "auto-ds", "0")]
    assert wait == pytest.approx(waited, abs=1e-6)


def test_a_torch_loader_reports_for_its_workers_with_their_skipped_shards(
    local_shards, daemon_factory, start_method
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source(
        "tars", local_shards.local_paths, daemon=str(daemon.socket), on_error="skip", job="auto-tl"
    )
    (local_shards.local_dir / local_shards.names[2]).unlink()
    loader = TorchLoader(
        ds,
        num_workers=2,
        batch_size=4,
        collate_fn=list,
        multiprocessing_context=worker_context(start_method),
    )
    it = iter(loader)
    assert sum(len(batch) for batch in it) == 3 * 8
    it.close()
    assert reported(daemon, "shardcache_client_samples_total", "auto-tl", 3 * 8) == 3 * 8
    assert reported(daemon, "shardcache_client_corrupt_samples_total", "auto-tl", 1) == 1


def test_daemon_none_turns_telemetry_off(local_shards) -> None:  # type: ignore[no-untyped-def]
    it = iter(Dataset.from_source("tars", local_shards.local_paths, daemon=None))
    assert isinstance(it, PipelineIterator)
    assert it.telemetry is None


def test_without_a_daemon_answering_iteration_goes_on_and_reports_are_dropped(  # type: ignore[no-untyped-def]
    local_shards, short_tmp: Path
) -> None:
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(short_tmp / "absent.sock"))
    it = iter(ds)
    assert isinstance(it, PipelineIterator)  # Dataset.__iter__ is typed as a plain Iterator
    assert len(list(it)) == 4 * 8
    assert it.telemetry is not None
    it.close()  # the last report is dropped quietly


def test_iterating_as_an_explicit_slot_in_tests_reports_nothing(local_shards) -> None:  # type: ignore[no-untyped-def]
    it = Dataset.from_source("tars", local_shards.local_paths).iter_context(RuntimeContext())
    assert it.telemetry is None
