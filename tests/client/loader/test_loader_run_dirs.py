"""A TorchLoader killed with kill -9 leaves its run directory in $TMPDIR; the next loader removes it.

Real processes: a trainer with DataLoader workers killed with its process group, then another trainer.
A run directory whose owner is alive (its lock held) is never touched.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from shardcache.loader.stream import OWNER_LOCK, RUN_DIR_PREFIX, WorkerHome, remove_dead_run_dirs

TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from shardcache import Dataset, TorchLoader

    kill_after_first_batch, urls = sys.argv[1] == "kill", sys.argv[2:]
    loader = TorchLoader(Dataset.from_source("tars", urls, daemon=None), num_workers=1, batch_size=4)
    for batch in loader:
        if kill_after_first_batch:
            print("started", flush=True)
            os.killpg(os.getpgrp(), signal.SIGKILL)  # an OOM kill of the trainer and its workers
    print("done", flush=True)
    """
)


def _trainer(script: Path, tmp: Path, mode: str, urls: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, str(script), mode, *urls],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,  # its own process group, killed as a whole
        check=False,
    )


def test_the_run_dir_of_a_killed_loader_is_removed_by_the_next_one(local_shards, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    killed = _trainer(script, tmp, "kill", local_shards.local_paths)
    assert killed.returncode == -signal.SIGKILL and "started" in killed.stdout, killed.stderr
    left = sorted(tmp.glob(f"{RUN_DIR_PREFIX}*"))
    assert len(left) == 1, left  # what the killed trainer leaves

    alive = tmp / f"{RUN_DIR_PREFIX}{os.getpid()}-alive"  # a live loader's directory: its lock held
    alive.mkdir()
    owner = os.open(alive / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    try:
        done = _trainer(script, tmp, "run", local_shards.local_paths)
        assert done.returncode == 0 and "done" in done.stdout, done.stderr
        assert sorted(tmp.glob(f"{RUN_DIR_PREFIX}*")) == [alive]
    finally:
        os.close(owner)


def test_a_sweep_while_a_new_loader_takes_its_lock_leaves_its_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trainers started together (torchrun's ranks) sweep $TMPDIR while the others make their run dirs: a
    # sweep that looked between the lock file's creation and its flock removed a live loader's directory.
    # Here another trainer's sweep runs at exactly that moment: when the new loader takes its lock.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real_flock = fcntl.flock
    swept: list[int] = []

    def flock_after_a_sweep(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX and not swept:  # the owner's blocking lock (a sweep's is LOCK_NB)
            swept.append(remove_dead_run_dirs(tmp_path))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_sweep)
    home = WorkerHome(persistent=True)
    try:
        assert swept == [0], "the sweep removed the new loader's run dir"
        assert (Path(home.run_dir) / OWNER_LOCK).is_file()
    finally:
        home.close()
