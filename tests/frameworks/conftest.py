"""Fixtures of the framework tests: the shards the test scripts read, the toy dataset the examples read
(written by `examples/frameworks/toy.py`, as a user writes it), and a daemon for the launches that use one.

The daemons are module-scoped, like the launches that read them: one daemon per test module, so its
metrics count that module's launches only.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.devservers import Daemon, start_daemon
from tests.frameworks.framework_checks import ToyData, write_shards, write_toy_data


@pytest.fixture(scope="module", params=["processes", "threads"])
def framework_workers(request: pytest.FixtureRequest) -> str:
    """How the TorchLoaders of a module's launches run their workers (SHARDCACHE_LOADER_WORKERS): every
    recipe works in both modes."""
    mode: str = request.param
    return mode


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """8 tar shards of 35 to 44 samples (315 in all), as a brace pattern."""
    return write_shards(tmp_path_factory.mktemp("framework-shards"))


@pytest.fixture(scope="session")
def toy(tmp_path_factory: pytest.TempPathFactory) -> ToyData:
    """The examples' toy dataset (train and validation tar shards with their manifests)."""
    return write_toy_data(tmp_path_factory.mktemp("toy-data"))


@pytest.fixture(scope="module")
def no_daemon() -> Iterator[Path]:
    """A socket path where no daemon listens (SHARDCACHE_SOCKET for the launches without one): the default
    daemon="auto" reads directly, and no daemon running on this machine is found by accident."""
    folder = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    try:
        yield folder / "absent.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(shards: str, toy: ToyData, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real shardcached allowed to read the shards and the toy dataset (socket under a short /tmp path)."""
    folder = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    logs = tmp_path_factory.mktemp("framework-daemon")
    allowed = [str(Path(shards).parent), str(toy.root)]
    started = start_daemon(folder / "d.sock", logs / "cache", allowed, log=logs / "daemon.log")
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(folder, ignore_errors=True)
