"""Fixtures of the hardening tests: fault-injecting proxies in front of S3, and a small filesystem."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.tools import unavailable
from tests.hardening.faultproxy import FaultProxy


@pytest.fixture
def fault_proxy(s3_server: Any) -> Iterator[Callable[..., FaultProxy]]:
    """Factory: a FaultProxy in front of the session's moto server; closed after the test."""
    proxies: list[FaultProxy] = []

    def make(**options: Any) -> FaultProxy:
        proxy = FaultProxy(s3_server.endpoint, **options)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted for this test (root only); lazily unmounted after."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
