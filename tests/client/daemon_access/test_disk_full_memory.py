"""After a 507 `cache_disk_full` an `auto` client reads directly for a bounded while, one warning an episode.

The memory itself (`shardcache.daemon_access.direct.DiskFullMemory`) on a hand-driven clock; the real daemon
on a full filesystem is in tests/hardening/test_disk_full_of_other_files.py.
"""

from __future__ import annotations

import logging
import pickle

import pytest

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.direct import DISK_FULL_RETRY_S, DiskFullMemory
from shardcache.errors import ConfigError, InsufficientCapacity


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def disk_full(url: str = "s3://b/shard_000000.tar") -> InsufficientCapacity:
    return InsufficientCapacity(507, "cache_disk_full", "no room: other files fill it", url)


def test_the_daemon_is_asked_until_the_first_refusal() -> None:
    assert not DiskFullMemory(clock=Clock()).skip_daemon()


def test_a_refusal_skips_the_daemon_for_the_retry_window_then_asks_again() -> None:
    clock = Clock()
    memory = DiskFullMemory(retry_s=30.0, clock=clock)
    memory.refused("s3://b/a.tar", disk_full())
    clock.now += 29.9
    assert memory.skip_daemon()
    clock.now += 0.1
    assert not memory.skip_daemon()


def test_an_open_the_daemon_served_ends_the_window() -> None:
    memory = DiskFullMemory(retry_s=30.0, clock=Clock())
    memory.refused("s3://b/a.tar", disk_full())
    memory.served()
    assert not memory.skip_daemon()


def test_one_warning_per_episode_however_often_the_full_disk_is_confirmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="shardcache")
    memory = DiskFullMemory(clock=Clock())
    for _ in range(5):
        memory.refused("s3://b/a.tar", disk_full())
    memory.served()  # the disk had room again; a later refusal is news
    memory.refused("s3://b/a.tar", disk_full())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "every 30 s" in warnings[0] and "docs/troubleshooting.md" in warnings[0]


def test_the_window_defaults_to_the_module_constant_and_survives_pickling() -> None:
    assert DaemonClient("/nonexistent.sock").disk_full_retry_s == DISK_FULL_RETRY_S
    copy = pickle.loads(pickle.dumps(DaemonClient("/nonexistent.sock", disk_full_retry_s=5.0)))
    assert copy.disk_full_retry_s == 5.0


@pytest.mark.parametrize("value", [-1.0, 3601.0])
def test_a_window_outside_zero_to_an_hour_is_a_config_error(value: float) -> None:
    with pytest.raises(ConfigError, match="disk_full_retry_s"):
        DaemonClient("/nonexistent.sock", disk_full_retry_s=value)
