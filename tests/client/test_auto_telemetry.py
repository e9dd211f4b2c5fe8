"""Iteration reports trainer telemetry by itself: wait time, samples and skipped shards per (job, slot)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_support import worker_context
from test_telemetry import client_samples

from shardcache import Dataset, RuntimeContext, TorchLoader


def test_a_dataset_iterated_in_the_trainer_reports_its_samples_and_wait(local_shards, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="auto-ds")
    it = iter(ds)
    assert len(list(it)) == 4 * 8
    assert it.telemetry is not None
    waited = it.telemetry.waited_s
    it.close()  # the last figures are sent when the iteration is released
    series = client_samples(daemon)
    assert series[("shardcache_client_samples_total", "auto-ds", "0")] == 4 * 8
    assert series[("shardcache_client_wait_seconds_total", "auto-ds", "0")] == pytest.approx(waited, abs=1e-6)


def test_a_torch_loader_reports_for_its_workers_with_their_skipped_shards(
    local_shards, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source(
        "tars", local_shards.local_paths, daemon=str(daemon.socket), on_error="skip", job="auto-tl"
    )
    (local_shards.local_dir / local_shards.names[2]).unlink()
    loader = TorchLoader(
        ds, num_workers=2, batch_size=4, collate_fn=list, multiprocessing_context=worker_context()
    )
    it = iter(loader)
    assert sum(len(batch) for batch in it) == 3 * 8
    it.close()
    series = client_samples(daemon)
    assert series[("shardcache_client_samples_total", "auto-tl", "0")] == 3 * 8
    assert series[("shardcache_client_corrupt_samples_total", "auto-tl", "0")] == 1


def test_daemon_none_turns_telemetry_off(local_shards) -> None:  # type: ignore[no-untyped-def]
    it = iter(Dataset.from_source("tars", local_shards.local_paths, daemon=None))
    assert it.telemetry is None  # type: ignore[attr-defined]


def test_without_a_daemon_answering_iteration_goes_on_and_reports_are_dropped(  # type: ignore[no-untyped-def]
    local_shards, short_tmp: Path
) -> None:
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(short_tmp / "absent.sock"))
    it = iter(ds)
    assert len(list(it)) == 4 * 8
    assert it.telemetry is not None
    it.close()  # the last report is dropped quietly


def test_iterating_as_an_explicit_slot_in_tests_reports_nothing(local_shards) -> None:  # type: ignore[no-untyped-def]
    it = Dataset.from_source("tars", local_shards.local_paths).iter_context(RuntimeContext())
    assert it.telemetry is None
