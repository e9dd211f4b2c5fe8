"""The trainer demo stops cleanly: Ctrl-C, SIGTERM, or a rank that makes no progress ends every process it
started (ranks, their DataLoader workers, shardcached, moto) within seconds, with a message and a status.

Each test runs the demo (tiny) in its own session, records its whole process tree while it runs, and checks
afterwards that none of those processes, nor any other of the session, is left. Deadlines fail the test with
the demo's output, the stacks its processes dump on SIGUSR1, and what was still running; the teardown kills
whatever is left, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from tests.client.test_demo import EXAMPLES, demo_command, demo_env, samples_per_shard

START_S = 240.0  # start-up on two busy cores: moto, the upload, the daemon, two ranks importing torch
STOP_S = 20.0  # from the signal (or the stall) to the demo's exit: "within seconds", with room for a busy CI
LEFT_S = 5.0  # from the demo's exit until nothing of it is left (multiprocessing's resource tracker)
HUNG = "test hook: a DataLoader worker of rank 1 hangs"
STALL_S = 10  # --stall-timeout in the stall tests: well above a healthy rank's longest silence here


class RunningDemo:
    """The demo in its own session, its output read by a thread, every process of its tree recorded."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            demo_command(*args),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=demo_env(cwd),
            start_new_session=True,  # as a terminal's foreground job: Ctrl-C goes to its process group
        )
        self.lines: list[str] = []
        self.seen: dict[int, psutil.Process] = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def record(self) -> None:
        """Add the demo's current process tree to `seen` (psutil.Process objects survive pid reuse)."""
        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for process in tree:
            self.seen.setdefault(process.pid, process)

    def ranks(self) -> list[psutil.Process]:
        """The rank processes (spawned by the coordinator, so started through `spawn_main`)."""
        ranks = []
        for process in _children(self.proc.pid):
            try:
                if "spawn_main" in " ".join(process.cmdline()):
                    ranks.append(process)
            except psutil.Error:
                continue
        return ranks

    def left(self) -> list[psutil.Process]:
        """Every process of the demo still alive: recorded in its tree, or in its session."""
        left = {p.pid: p for p in self.seen.values() if _alive(p)}
        for process in psutil.process_iter():
            try:
                if os.getsid(process.pid) == self.proc.pid and _alive(process):
                    left.setdefault(process.pid, process)
            except (OSError, psutil.Error):
                continue
        return list(left.values())

    def poll_until(self, check: Callable[[], bool], what: str, deadline_s: float) -> None:
        """Record the tree and poll `check` until it holds; fail with everything known after the deadline."""
        deadline = time.monotonic() + deadline_s
        while not check():
            self.record()
            if self.proc.poll() is not None and not check():
                self.fail(f"the demo exited with status {self.proc.returncode} before {what}")
            if time.monotonic() > deadline:
                self.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")
            time.sleep(0.02)
        self.record()

    def exit_status(self, deadline_s: float) -> int:
        self.poll_until(lambda: self.proc.poll() is not None, "the demo to exit", deadline_s)
        self.reader.join(timeout=5)
        return self.proc.returncode

    def fail(self, why: str) -> None:
        """Fail the test with the output, the stacks of what still runs (SIGUSR1), and its process list."""
        left = self.left()
        for process in left:
            if "python" in _command(process):  # the demo's processes dump their stacks on SIGUSR1
                try:
                    process.send_signal(signal.SIGUSR1)
                except psutil.Error:
                    continue
        time.sleep(1)  # let the dumps reach the pipe: diagnostics only, after the test has already failed
        listing = "\n".join(f"  {p.pid} {_command(p)}" for p in left)
        pytest.fail(f"{why}\n--- still running ---\n{listing}\n--- demo output ---\n{self.output}")

    def kill_everything(self) -> None:
        for process in self.left():
            try:
                process.kill()
            except psutil.Error:
                continue
        self.proc.kill()
        self.proc.wait(timeout=10)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children())
    except psutil.Error:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:200]
    except psutil.Error:
        return "?"


@pytest.fixture
def run_demo(tmp_path: Path) -> Iterator[Callable[..., RunningDemo]]:
    demos: list[RunningDemo] = []

    def start(*args: str) -> RunningDemo:
        demos.append(RunningDemo(tmp_path, *args))
        return demos[-1]

    yield start
    for demo in demos:
        demo.kill_everything()


def training(demo: RunningDemo) -> bool:
    """Both ranks have their DataLoader workers: the demo is in the middle of an epoch."""
    ranks = demo.ranks()
    return len(ranks) == 2 and all(_children(rank.pid) for rank in ranks)


def assert_nothing_left(demo: RunningDemo) -> None:
    assert len(demo.seen) >= 8, demo.seen  # coordinator, moto, daemon, tracker, two ranks, their workers
    deadline = time.monotonic() + LEFT_S
    while (left := demo.left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        demo.fail(f"{len(left)} processes of the demo outlived it")


@pytest.mark.parametrize(
    ("target", "signum", "status", "said"),
    [
        ("group", signal.SIGINT, 130, "interrupted (Ctrl-C)"),  # what a terminal's Ctrl-C does
        ("coordinator", signal.SIGINT, 130, "interrupted (Ctrl-C)"),
        ("coordinator", signal.SIGTERM, 143, "interrupted (SIGTERM)"),
    ],
    ids=["ctrl-c", "sigint", "sigterm"],
)
def test_a_signal_stops_every_process_of_the_demo(
    run_demo: Callable[..., RunningDemo], target: str, signum: int, status: int, said: str
) -> None:
    demo = run_demo("--epochs", "50")
    demo.poll_until(lambda: training(demo), "both ranks training with their workers", START_S)
    (os.killpg if target == "group" else os.kill)(demo.proc.pid, signum)
    started = time.monotonic()
    assert demo.exit_status(STOP_S) == status, demo.output
    assert time.monotonic() - started < STOP_S
    assert said in demo.output
    assert re.search(
        r"killed ranks 0, 1 with their DataLoader workers \(process groups \d+, \d+\)", demo.output
    )
    assert "stopped shardcached, stopped the S3 endpoint" in demo.output
    assert_nothing_left(demo)


def test_ctrl_c_while_a_ranks_workers_hang(run_demo: Callable[..., RunningDemo]) -> None:
    # The user's report: a rank stuck for good on its hung DataLoader workers (the other one goes on to the
    # barrier), no stall timeout, then Ctrl-C. Hung workers never notice that their rank is gone: only
    # killing them ends them.
    demo = run_demo("--test-stall", "1:0", "--stall-timeout", "0")
    demo.poll_until(lambda: demo.output.count(HUNG) == 2, "both workers of rank 1 to hang", START_S)
    os.killpg(demo.proc.pid, signal.SIGINT)
    assert demo.exit_status(STOP_S) == 130, demo.output
    assert "killed ranks 0, 1 with their DataLoader workers" in demo.output
    assert_nothing_left(demo)


def test_a_rank_without_progress_stops_the_demo_and_says_which(run_demo: Callable[..., RunningDemo]) -> None:
    # Four shards, two ranks of two workers: one shard a worker. Rank 1's workers produce their shard's
    # samples in epoch 1, then hang on their first sample of epoch 2.
    per_worker = samples_per_shard(int(0.5 * 1024 * 1024))
    demo = run_demo("--test-stall", f"1:{per_worker}", "--stall-timeout", str(STALL_S))
    demo.poll_until(lambda: HUNG in demo.output, "rank 1's workers to hang", START_S)
    stalled_at = time.monotonic()
    assert demo.exit_status(STALL_S + STOP_S) == 1, demo.output
    assert time.monotonic() - stalled_at >= STALL_S - 1  # not before the timeout
    message = re.search(
        r"rank 1 made no progress for (\d+)s \(--stall-timeout 10\), since \d\d:\d\d:\d\d: training in "
        r"epoch 2, [1-9]\d* training steps done; rank 0 was waiting at the barrier",
        demo.output,
    )
    assert message, demo.output
    assert int(message.group(1)) >= STALL_S
    assert re.search(
        r"Stopped the demo: killed ranks 0, 1 with their DataLoader workers \(process groups \d+, \d+\), "
        r"stopped shardcached, stopped the S3 endpoint",
        demo.output,
    )
    assert_nothing_left(demo)


def _stopping_module() -> ModuleType:
    """`trainer_demo.stopping` (standard library only), loaded from its file as `samples_per_shard` does."""
    spec = importlib.util.spec_from_file_location(
        "trainer_demo_stopping", EXAMPLES / "trainer_demo" / "stopping.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_progress_watch_names_the_silent_rank_not_the_one_at_the_barrier() -> None:
    stopping = _stopping_module()
    now = [0.0]
    watch = stopping.ProgressWatch(2, 10, start_s=30, clock=lambda: now[0], wall=lambda: 0.0)
    now[0] = 29.0
    assert watch.stalled() is None  # starting: the start-up allowance applies
    watch.report(0, 2, "training")
    watch.report(1, 1, "training")
    watch.finished_epoch(0)
    now[0] = 38.9
    assert watch.stalled() is None
    now[0] = 39.0
    message = watch.stalled()
    assert message is not None and message.startswith("rank 1 made no progress for 10s (--stall-timeout 10)")
    assert "training in epoch 1, 1 training steps done; rank 0 was waiting at the barrier" in message
    now[0] = 1000.0
    watch.next_epoch()  # everyone passed the barrier: the clocks start again
    assert watch.stalled() is None
    never = stopping.ProgressWatch(1, 0, clock=lambda: now[0])
    now[0] = 1e9
    assert never.stalled() is None
