"""Waiting for a condition in tests: poll with a deadline, never sleep a guessed time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Poll `check` until it is true; fail after the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")


def wait_child(pid: int, timeout_s: float = 30.0) -> int:
    """The exit status of a forked child; a child still running at the deadline is killed and fails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)  # polling a child process's exit
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child {pid} hung (killed after {timeout_s:g}s)")
