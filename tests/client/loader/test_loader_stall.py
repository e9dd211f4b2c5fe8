"""TorchLoader's stall watchdog: a loader that waits too long for an item says which worker and where it is.

A map function holds one sample until the test creates a release file, so the stall is real (the worker
is blocked in Python code) and ends when the test says so. The loader iterates in a background thread; the
test polls the captured log for the warning, releases the sample and joins the thread, every wait bounded.
Workers start with torch's default method (fork on Linux, what users get).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from harness.polling import wait_for

pytest.importorskip("torch.utils.data")

from shardcache import Dataset, TorchLoader  # noqa: E402
from shardcache.context import torch_worker_id  # noqa: E402
from shardcache.errors import ConfigError  # noqa: E402

NUM_WORKERS = 2
SHARDS, SAMPLES = 4, 5
ALL_KEYS = sorted(f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(SAMPLES))
STALL_WARNING_S = 0.5
DEADLINE_S = 30.0
# A held sample gives up after this long, so a failed test never leaves a worker blocked for good.
HOLD_LIMIT_S = 60.0
WATCHDOG_THREAD = "shardcache-stall-watchdog"
ENV = "SHARDCACHE_STALL_WARNING_S"


def stall_until(sample: dict[str, Any], releases: dict[str, str]) -> str:
    """Hold the sample whose key is in `releases` until its release file exists; then pass its key on.

    While it holds, it writes which worker holds it next to the release file ("<release>.holder").
    """
    key = str(sample["__key__"])
    release = releases.get(key)
    if release is not None:
        worker = torch_worker_id()  # a worker process, or a thread running as one
        Path(release + ".holder").write_text(str(-1 if worker is None else worker))
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return key


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=SHARDS, samples=SAMPLES)


@pytest.fixture
def caplog_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="shardcache")
    return caplog


def stalls(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The stall warnings logged so far."""
    return [
        r.getMessage()
        for r in list(caplog.records)
        if r.name == "shardcache.loader.watchdog" and r.levelno == logging.WARNING
    ]


def holding(tars: list[str], releases: dict[str, Path]) -> Dataset:
    fn = functools.partial(stall_until, releases={k: str(p) for k, p in releases.items()})
    return Dataset.from_source("tars", tars, daemon=None).map(fn)


@dataclass
class Background:
    """A loader iterated to its end in another thread."""

    items: list[Any] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None

    def join(self) -> list[Any]:
        assert self.thread is not None
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive(), f"the iteration did not finish within {DEADLINE_S:.0f}s"
        if self.errors:
            raise self.errors[0]
        return self.items


@contextmanager
def iterating(loader: TorchLoader, releases: dict[str, Path]) -> Iterator[Background]:
    """Iterate `loader` in a thread; on the way out release every held sample, join and close."""
    run = Background()

    def consume() -> None:
        try:
            for item in loader:
                run.items.append(item)
        except BaseException as exc:  # reported by join(), in the test's thread
            run.errors.append(exc)

    run.thread = threading.Thread(target=consume, name="test-iteration", daemon=True)
    run.thread.start()
    try:
        yield run
    finally:
        for release in releases.values():
            release.touch()
        run.thread.join(DEADLINE_S)
        loader.close()


def wait_for_stalls(caplog: pytest.LogCaptureFixture, count: int) -> list[str]:
    wait_for(lambda: len(stalls(caplog)) >= count, f"stall warning #{count}", DEADLINE_S)
    return stalls(caplog)


def holder(release: Path) -> int:
    """Which worker holds the sample behind `release` (written by `stall_until`)."""
    path = Path(str(release) + ".holder")
    wait_for(path.exists, "the held sample to be reached", DEADLINE_S)
    return int(path.read_text())


def stack_of(warning: str, worker: int) -> str:
    """One worker's stack in a stall warning."""
    header = f"--- worker {worker} (pid "
    assert header in warning, f"no stack of worker {worker} in the warning"
    return warning.split(header, 1)[1].split("--- worker ", 1)[0]


def test_a_stalled_worker_is_named_with_its_stack(
    tars: list[str], tmp_path: Path, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    releases = {"s001_0002": tmp_path / "release"}
    loader = TorchLoader(holding(tars, releases), num_workers=NUM_WORKERS, stall_warning_s=STALL_WARNING_S)
    with iterating(loader, releases) as run:
        [warning] = wait_for_stalls(caplog_warnings, 1)
        worker = holder(releases["s001_0002"])
        releases["s001_0002"].touch()
        items = run.join()
    assert sorted(items) == ALL_KEYS, "the loader kept waiting and then finished the epoch"
    assert f"the merge waits for DataLoader worker {worker} of {NUM_WORKERS}" in warning
    awaited = [line.split("(pid")[0].strip() for line in warning.splitlines() if "<- awaited" in line]
    assert awaited == [f"worker {worker}"]
    assert all(f"worker {w} (pid " in warning for w in range(NUM_WORKERS)), "every worker is listed"
    assert "stall_until" in stack_of(warning, worker), "the held worker's stack, where it holds"
    assert "stall_warning_s=0" in warning, "it says how to turn it off"


def test_a_stalled_worker_thread_is_named_with_its_stack(
    tars: list[str], tmp_path: Path, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    releases = {"s001_0002": tmp_path / "release"}
    loader = TorchLoader(
        holding(tars, releases), num_workers=NUM_WORKERS, workers="threads", stall_warning_s=STALL_WARNING_S
    )
    with iterating(loader, releases) as run:
        [warning] = wait_for_stalls(caplog_warnings, 1)
        worker = holder(releases["s001_0002"])
        releases["s001_0002"].touch()
        items = run.join()
    assert sorted(items) == ALL_KEYS
    assert f"the merge waits for worker thread {worker} of {NUM_WORKERS}" in warning
    awaited = [line.strip() for line in warning.splitlines() if "<- awaited" in line]
    assert len(awaited) == 1 and awaited[0].startswith(f"worker {worker} (thread shardcache-worker-{worker})")
    header = f"--- worker {worker} (thread shardcache-worker-{worker})"
    assert header in warning, "the held thread's stack"
    assert "stall_until" in warning.split(header, 1)[1].split("--- worker ", 1)[0], "where it holds"


def test_a_persistent_worker_stalled_in_a_later_epoch_is_named_with_its_stack(
    tars: list[str], tmp_path: Path, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    release = tmp_path / "release"
    releases = {"s002_0001": release}
    loader = TorchLoader(holding(tars, releases), num_workers=NUM_WORKERS, stall_warning_s=STALL_WARNING_S)
    release.touch()  # epoch 0 flows
    try:
        assert sorted(loader) == ALL_KEYS
    except BaseException:
        loader.close()
        raise
    assert stalls(caplog_warnings) == []
    release.unlink()
    Path(str(release) + ".holder").unlink()
    loader.set_epoch(1)
    with iterating(loader, releases) as run:
        [warning] = wait_for_stalls(caplog_warnings, 1)
        worker = holder(release)
        release.touch()
        items = run.join()
    assert sorted(items) == ALL_KEYS
    assert "stall_until" in stack_of(warning, worker)


def test_it_warns_once_per_stall_and_again_after_items_flowed(
    tars: list[str], tmp_path: Path, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    releases = {"s000_0001": tmp_path / "first", "s000_0004": tmp_path / "second"}
    loader = TorchLoader(holding(tars, releases), num_workers=NUM_WORKERS, stall_warning_s=STALL_WARNING_S)
    with iterating(loader, releases) as run:
        wait_for_stalls(caplog_warnings, 1)
        # Hold the stall for many of the watchdog's checks (it checks every stall_warning_s / 4).
        time.sleep(6 * STALL_WARNING_S)
        assert len(stalls(caplog_warnings)) == 1, "one warning per stall, not one per check"
        flowed = len(run.items)
        releases["s000_0001"].touch()
        wait_for_stalls(caplog_warnings, 2)
        assert len(run.items) > flowed, "the second warning is for a new stall, after items arrived"
        releases["s000_0004"].touch()
        items = run.join()
    assert sorted(items) == ALL_KEYS
    assert len(stalls(caplog_warnings)) == 2


def test_without_workers_it_shows_the_main_process_threads(
    tars: list[str], tmp_path: Path, caplog_warnings: pytest.LogCaptureFixture
) -> None:
    releases = {"s001_0002": tmp_path / "release"}
    loader = TorchLoader(holding(tars, releases), num_workers=0, stall_warning_s=STALL_WARNING_S)
    with iterating(loader, releases) as run:
        [warning] = wait_for_stalls(caplog_warnings, 1)
        releases["s001_0002"].touch()
        items = run.join()
    assert sorted(items) == ALL_KEYS
    assert "the merge waits for the main process" in warning
    assert "Threads of the main process" in warning
    assert "Thread test-iteration:" in warning and "stall_until" in warning


# -- turning it off, and the setting ---------------------------------------------------------------------


def watchdogs_started_while_iterating(loader: TorchLoader) -> list[threading.Thread]:
    """The watchdog threads that appear while `loader` is in the middle of an epoch."""
    before = set(threading.enumerate())
    iterator = iter(loader)
    try:
        next(iterator)
        return [t for t in threading.enumerate() if t not in before and t.name == WATCHDOG_THREAD]
    finally:
        iterator.close()
        loader.close()


def plain(tars: list[str]) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None)


@pytest.mark.parametrize("off", [0, 0.0, None])
def test_stall_warning_s_0_or_none_starts_no_watchdog(tars: list[str], off: float | None) -> None:
    assert watchdogs_started_while_iterating(TorchLoader(plain(tars), stall_warning_s=off)) == []


def test_the_environment_variable_0_starts_no_watchdog(
    tars: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "0")
    assert watchdogs_started_while_iterating(TorchLoader(plain(tars))) == []


@pytest.mark.parametrize("num_workers", [0, NUM_WORKERS])
def test_the_watchdog_runs_during_an_iteration_by_default(tars: list[str], num_workers: int) -> None:
    started = watchdogs_started_while_iterating(TorchLoader(plain(tars), num_workers=num_workers))
    assert [t.name for t in started] == [WATCHDOG_THREAD]


def test_the_default_is_300_seconds(monkeypatch: pytest.MonkeyPatch, tars: list[str]) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert TorchLoader(plain(tars)).stall_warning_s == 300


def test_the_environment_variable_sets_the_default(monkeypatch: pytest.MonkeyPatch, tars: list[str]) -> None:
    monkeypatch.setenv(ENV, "7.5")
    assert TorchLoader(plain(tars)).stall_warning_s == 7.5
    assert TorchLoader(plain(tars), stall_warning_s=2).stall_warning_s == 2, "the argument wins"


def test_the_environment_variable_reaches_an_iteration(
    tars: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog_warnings: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(ENV, str(STALL_WARNING_S))
    releases = {"s000_0001": tmp_path / "release"}
    loader = TorchLoader(holding(tars, releases), num_workers=0)
    with iterating(loader, releases) as run:
        wait_for_stalls(caplog_warnings, 1)
        releases["s000_0001"].touch()
        assert sorted(run.join()) == ALL_KEYS


@pytest.mark.parametrize("bad", ["-1", "abc", "nan"])
def test_a_bad_environment_value_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tars: list[str], bad: str
) -> None:
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(ConfigError, match=ENV):
        TorchLoader(plain(tars))


@pytest.mark.parametrize("bad", [-1, "abc", float("nan")])
def test_a_bad_argument_is_a_config_error_naming_it(tars: list[str], bad: Any) -> None:
    with pytest.raises(ConfigError, match="stall_warning_s"):
        TorchLoader(plain(tars), stall_warning_s=bad)
