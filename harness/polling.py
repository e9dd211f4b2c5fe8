"""Waiting for a condition in tests: poll with a deadline, never sleep a guessed time."""

from __future__ import annotations

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
