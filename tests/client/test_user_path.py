"""What users run: the plain training script in a fresh interpreter, under each start method, with the daemon
running, absent or restarted mid-epoch, with and without persistent workers, four epochs, pin_memory on.

Each run is `harness/user_script.py` under a watchdog (`harness.watchdog`): a run that hangs
fails with the stacks of every process it started instead of hanging CI. Before the fork-safety rules
(`shardcache.forksafe`), the fork case hung in 5 of 6 runs at the second epoch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import api
from harness.devservers import Daemon
from harness.pipelines import make_tars
from harness.watchdog import Watched, run_watched

EPOCHS = 4
SHARDS, SAMPLES = 8, 32
# A run takes 3-15 s here (spawn starts a fresh interpreter per worker); a hang is anything past this.
RUN_TIMEOUT_S = 120.0
REPO = Path(__file__).resolve().parents[2]
DAEMON_STATES = ("running", "absent", "restarted")


@pytest.fixture
def shard_pattern(tmp_path: Path) -> str:
    make_tars(tmp_path / "shards", SHARDS, SAMPLES)
    return str(tmp_path / "shards" / "shard_{000000..000007}.tar")


def script(pattern: str, socket: str | None, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "harness.user_script", "--shards", pattern, "--epochs", str(EPOCHS)]
    return command + (["--socket", socket] if socket else []) + list(extra)


def epochs_of(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"epoch"')]


def assert_every_epoch_whole(output: str, persistent: bool) -> None:
    """Every sample once per epoch, a new order each epoch, and workers that persist or restart as asked."""
    epochs = epochs_of(output)
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS)), output
    for epoch in epochs:
        assert epoch["samples"] == epoch["distinct"] == SHARDS * SAMPLES, output
    assert len({e["digest"] for e in epochs}) == EPOCHS, f"an epoch repeated another's order:\n{output}"
    pids = [tuple(e["worker_pids"]) for e in epochs]
    assert all(len(p) == 2 for p in pids), output
    if persistent:
        assert len(set(pids)) == 1, f"persistent workers were restarted: {pids}"
    else:
        assert len(set(pids)) == EPOCHS, f"workers were not restarted each epoch: {pids}"


# The default start method (what users get) meets every daemon state with and without persistent workers;
# forkserver and spawn meet every daemon state and both persistence settings (every pair of factors is
# covered, at two thirds of the full matrix's time: spawn runs take ~25 s each here).
USER_PATHS = [
    *[("default", state, persistent) for state in DAEMON_STATES for persistent in ("false", "true")],
    ("forkserver", "running", "true"),
    ("forkserver", "absent", "false"),
    ("forkserver", "restarted", "true"),
    ("spawn", "running", "false"),
    ("spawn", "absent", "true"),
    ("spawn", "restarted", "false"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "daemon_state", "persistent"), USER_PATHS)
def test_the_plain_script_finishes_every_epoch(
    method: str,
    daemon_state: str,
    persistent: str,
    shard_pattern: str,
    daemon_factory: Callable[..., Daemon],
    short_tmp: Path,
    tmp_path: Path,
) -> None:
    args = ["--start-method", method, "--persistent", persistent]
    allow = [str(Path(shard_pattern).parent)]
    if daemon_state == "absent":
        absent = str(short_tmp / "absent.sock")
        done = run_watched(script(shard_pattern, absent, *args), RUN_TIMEOUT_S, cwd=REPO)
        assert done.returncode == 0, done.stdout
        assert "reading shards directly" in done.stdout
    elif daemon_state == "running":
        daemon = daemon_factory(allow)
        done = run_watched(script(shard_pattern, daemon.socket, *args), RUN_TIMEOUT_S, cwd=REPO)
        assert done.returncode == 0, done.stdout
        stats = api(daemon).get("/v1/stats").json()
        assert stats["hits"] + stats["misses"] == SHARDS * EPOCHS  # every open went through the daemon
    else:
        daemon = daemon_factory(allow)
        resume = tmp_path / "resume"
        pause = ["--pause-at", "1", "--resume-file", str(resume)]
        run = Watched(script(shard_pattern, daemon.socket, *args, *pause), RUN_TIMEOUT_S, cwd=REPO)
        run.wait_for('"paused"')
        daemon.stop()
        restarted = daemon_factory(allow, socket_path=Path(daemon.socket), cache_dir=daemon.cache_dir)
        resume.touch()
        done = run.finish()
        assert done.returncode == 0, done.stdout
        stats = api(restarted).get("/v1/stats").json()
        assert stats["hits"] + stats["misses"] > 0, "the workers did not go back to the restarted daemon"
    assert_every_epoch_whole(done.stdout, persistent == "true")


@pytest.mark.slow
def test_the_plain_script_with_fork_workers_never_hangs(
    shard_pattern: str, daemon_factory: Callable[..., Daemon]
) -> None:
    """The case that hung: fork workers started anew every epoch while the trainer's threads work.

    It hung in 5 of 6 runs before the fork-safety rules: 8 runs miss a return of it with odds below 1e-6.
    """
    daemon = daemon_factory([str(Path(shard_pattern).parent)])
    command = script(shard_pattern, daemon.socket, "--start-method", "fork", "--persistent", "false")
    with ThreadPoolExecutor(2) as pool:  # two at a time: the machine has two cores
        runs = list(pool.map(lambda _: run_watched(command, RUN_TIMEOUT_S, cwd=REPO), range(8)))
    for done in runs:
        assert done.returncode == 0, done.stdout
        assert_every_epoch_whole(done.stdout, persistent=False)
