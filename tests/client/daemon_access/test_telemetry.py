"""Trainer telemetry through the real daemon: reports become `shardcache_client_*` metrics, never block."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.daemon_api import client_samples
from harness.devservers import Daemon
from shardcache.daemon_access.item_counts import count_items
from shardcache.daemon_access.telemetry import Telemetry
from shardcache.daemon_access.transport import Transport


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    return daemon_factory(allow=[str(tmp_path)])


def test_a_watched_loop_reports_samples_wait_and_corrupt_counts(daemon: Daemon) -> None:
    telemetry = Telemetry(job="resnet", slot=3, socket=daemon.socket, interval_s=0)
    batches = [[0] * 4 for _ in range(5)]
    assert list(telemetry.watch(batches)) == batches
    telemetry.add_corrupt(2)
    assert telemetry.flush() is True
    series = client_samples(daemon)
    assert series[("shardcache_client_samples_total", "resnet", "3")] == 20
    assert series[("shardcache_client_corrupt_samples_total", "resnet", "3")] == 2
    assert series[("shardcache_client_wait_seconds_total", "resnet", "3")] == pytest.approx(
        telemetry.waited_s, abs=1e-6
    )


def test_each_report_carries_only_what_happened_since_the_previous_one(daemon: Daemon) -> None:
    telemetry = Telemetry(job="j", slot=0, socket=daemon.socket, interval_s=0, count=lambda _: 1)
    for _ in range(2):
        list(telemetry.watch(range(3)))
        telemetry.flush()
    telemetry.flush()  # nothing new: no report
    assert client_samples(daemon)[("shardcache_client_samples_total", "j", "0")] == 6


def test_the_background_thread_reports_without_the_trainer_flushing(daemon: Daemon) -> None:
    telemetry = Telemetry(job="bg", slot=1, socket=daemon.socket, interval_s=0.05, count=lambda _: 1)
    list(telemetry.watch(range(7)))
    deadline = time.monotonic() + 20
    key = ("shardcache_client_samples_total", "bg", "1")
    while client_samples(daemon).get(key) != 7:
        assert time.monotonic() < deadline, "no telemetry report arrived"
        time.sleep(0.05)
    telemetry.close()


def test_reports_without_a_daemon_are_dropped_silently(short_tmp: Path) -> None:
    with Telemetry(job="j", socket=str(short_tmp / "absent.sock"), interval_s=0.01) as telemetry:
        assert list(telemetry.watch(range(100))) == list(range(100))
        assert telemetry.flush() is False
    assert telemetry.samples == 100


def test_only_the_most_recent_jobs_keep_series_and_high_slots_share_a_label(daemon: Daemon) -> None:
    for index in range(10):
        telemetry = Telemetry(
            job=f"job{index}", slot=1000, socket=daemon.socket, interval_s=0, count=lambda _: 1
        )
        list(telemetry.watch([None]))
        telemetry.flush()
    jobs = {job for _, job, _ in client_samples(daemon)}
    assert jobs == {f"job{index}" for index in range(2, 10)}
    assert {slot for _, _, slot in client_samples(daemon)} == {"other"}


def test_the_daemon_rejects_a_malformed_report(daemon: Daemon) -> None:
    body = {"job": "j", "slot": -1, "samples": 1, "wait_seconds": 0.0, "interval_seconds": 1.0}
    answer = Transport(daemon.socket, 5).request("POST", "/v1/telemetry", body)
    assert answer.status == 422


def test_count_items_reads_the_batch_dimension() -> None:
    torch = pytest.importorskip("torch")
    assert count_items((torch.zeros(32, 3), torch.zeros(32))) == 32
    assert count_items({"image": torch.zeros(8, 2)}) == 8
    assert count_items([{"a": 1}, {"a": 2}]) == 2
    assert count_items({"a": 1}) == 1
