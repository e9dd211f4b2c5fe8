"""PeerWatch: a process's exit is reported once, by pidfd or by the sweep; unknown pids are never followed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from shardcached.peers import PeerWatch


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


async def _exits_seen(use_pidfd: bool) -> tuple[list[int], float]:
    exited: list[int] = []
    watch = PeerWatch(exited.append, use_pidfd=use_pidfd)
    proc = _sleeper()
    try:
        assert watch.watch(proc.pid) and watch.watch(proc.pid)  # idempotent
        watch.sweep()
        await asyncio.sleep(0.05)
        assert exited == []  # alive: nothing reported
        started = time.monotonic()
        proc.kill()  # not reaped yet: a zombie, which the sweep must count as gone
        while not exited and time.monotonic() - started < 5:
            watch.sweep()
            await asyncio.sleep(0.01)
        return exited, time.monotonic() - started
    finally:
        watch.close()
        proc.wait()


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "sweep"])
def test_an_exit_is_reported_once_within_a_second(use_pidfd: bool) -> None:
    exited, seconds = asyncio.run(_exits_seen(use_pidfd))
    assert len(exited) == 1 and seconds < 1.0


def test_a_pid_the_daemon_cannot_see_is_never_followed() -> None:
    async def check() -> list[int]:
        exited: list[int] = []
        watch = PeerWatch(exited.append)
        assert not watch.watch(0) and not watch.watch(None)
        watch.sweep()
        return exited

    assert asyncio.run(check()) == []
