"""Shared fixtures: a real S3 endpoint (moto's server in a subprocess) and the real daemon on a Unix socket.

Only fixtures and hooks live here; the plain helpers tests import are in the `harness` package at the
repository root, shared with bench/ (test modules never import a conftest). Tools the integration tests need
(moto, promtool, ...) must be present under CI=true: a skip fails the run there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from harness.devservers import Daemon, S3Server, start_daemon, start_s3_server
from harness.shards import ShardSet, make_tar_shard
from harness.start_methods import ALL_METHODS, LOADER_METHODS, LOADER_MODES
from harness.tools import IN_CI, unavailable


@pytest.fixture(autouse=True, scope="session")
def _cache_root_outside_the_repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The unified cache root (snapshots, Lance filter and reference indexes) defaults to `./.cache` of the
    working directory; tests that do not choose one write under a session temporary directory instead of
    the repository. Tests of the default itself remove the variable with monkeypatch."""
    if os.environ.get("SHARDCACHE_CACHE_DIR") or os.environ.get("MVP_DATASET_CACHE_DIR"):
        yield
        return
    os.environ["SHARDCACHE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache-root"))
    try:
        yield
    finally:
        os.environ.pop("SHARDCACHE_CACHE_DIR", None)


def _fail_skip_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where a missing tool or package fails the run: {report.longrepr}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true every skip (pytest.skip, importorskip, skipif) fails: nothing is silently left out."""
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a module skipped at import (a module-level `pytest.importorskip`)."""
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())  # type: ignore[attr-defined]


@pytest.fixture(params=LOADER_METHODS, ids=LOADER_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    """How DataLoader workers start: "default" (torch's default, fork on Linux: what users get), then
    "forkserver". Pass it to `harness.start_methods.worker_context`."""
    method: str = request.param
    return method


@pytest.fixture(params=LOADER_MODES, ids=LOADER_MODES)
def loader_mode(request: pytest.FixtureRequest) -> str:
    """How a TorchLoader's workers run: worker processes started as `start_method` ("default", then
    "forkserver"), or "threads" (`workers="threads"`). Pass it to `harness.start_methods.loader_workers`."""
    mode: str = request.param
    return mode


@pytest.fixture(params=ALL_METHODS, ids=ALL_METHODS)
def any_start_method(request: pytest.FixtureRequest) -> str:
    """Every start method users choose: "default" (fork on Linux), "forkserver" and "spawn". For the
    resume contract and a few representative loader tests; spawn is too slow for every loader test."""
    method: str = request.param
    return method


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 endpoint: moto's server as a subprocess on 127.0.0.1, one per test session."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        unavailable("moto[server] is not installed")
    server = start_s3_server()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


@pytest.fixture(scope="session")
def s3_client(s3_server: S3Server):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")


_bucket_counter = iter(range(1_000_000))


@pytest.fixture
def make_bucket(s3_client, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ShardSet]:  # type: ignore[no-untyped-def]
    """Factory: a fresh bucket holding `count` generated tar shards under `shards/`."""

    def make(count: int = 4, samples: int = 8, payload_bytes: int = 1024) -> ShardSet:
        bucket = f"bucket-{os.getpid()}-{next(_bucket_counter)}"
        s3_client.create_bucket(Bucket=bucket)
        local = tmp_path_factory.mktemp("shards")
        names = []
        for i in range(count):
            name = f"shard_{i:06d}.tar"
            make_tar_shard(local / name, i, samples, payload_bytes)
            s3_client.upload_file(str(local / name), bucket, f"shards/{name}")
            names.append(name)
        return ShardSet(local, names, bucket)

    return make


@pytest.fixture
def local_shards(tmp_path: Path) -> ShardSet:
    """Four small tar shards on local disk."""
    local = tmp_path / "shards"
    local.mkdir()
    names = []
    for i in range(4):
        name = f"shard_{i:06d}.tar"
        make_tar_shard(local / name, i, samples=8)
        names.append(name)
    return ShardSet(local, names)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: Unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_factory(short_tmp: Path, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Factory: start the real daemon on a temporary Unix socket; every daemon started is stopped after."""
    started: list[Daemon] = []

    def start(
        allow: list[str],
        capacity: str = "1GiB",
        extra_args: list[str] | None = None,
        cache_dir: Path | None = None,
        socket_path: Path | None = None,
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
        reach_at: Path | None = None,
    ) -> Daemon:
        daemon = start_daemon(
            socket_path or short_tmp / f"d{len(started)}.sock",
            cache_dir or tmp_path / "cache",
            allow,
            capacity=capacity,
            extra_args=extra_args or [],
            env=env,
            log=tmp_path / f"daemon{len(started)}.log",
            wrapper=wrapper,
            reach_at=reach_at,
        )
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
