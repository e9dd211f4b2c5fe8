"""Run a command that may hang under a watchdog: on timeout, the stacks of every process it started.

A hung test must fail, not hang CI, and say where each process stood: `run_watched` waits for the
command with a deadline; past it, py-spy (a dev dependency) dumps every thread of the command and all its
descendants (DataLoader workers included), the whole tree is killed, and the test fails with the
command's output and the dumps.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

from harness.tools import unavailable


def py_spy() -> str:
    """The py-spy executable next to this interpreter (else on PATH); skip locally, fail in CI."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        unavailable("py-spy is not installed (pip install py-spy; part of the dev extra)")
    return found


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def dump_stacks(pid: int) -> str:
    """py-spy's dump of `pid` and every descendant, one section per process."""
    spy = py_spy()
    sections = []
    for process in process_tree(pid):
        try:
            command = " ".join(process.cmdline())[:200]
        except psutil.Error:
            command = "?"
        dump = subprocess.run(
            [spy, "dump", "--pid", str(process.pid)], capture_output=True, text=True, timeout=30
        )
        sections.append(f"=== pid {process.pid}: {command}\n{dump.stdout}{dump.stderr}")
    return "\n".join(sections)


def kill_tree(pid: int) -> None:
    processes = process_tree(pid)
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


class Watched:
    """A command running under a watchdog; its output is collected line by line as it comes.

    Args:
        command: The command line.
        timeout_s: Seconds from start until it must have finished (`finish`) or printed what `wait_for`
            waits for.
    """

    def __init__(
        self,
        command: Sequence[str],
        timeout_s: float,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        py_spy()  # fail early (under CI) rather than at the first hang
        self.command = " ".join(command)
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def _hung(self, waiting_for: str) -> NoReturn:
        stacks = dump_stacks(self.proc.pid)
        kill_tree(self.proc.pid)
        self._reader.join(10)
        pytest.fail(
            f"{self.command} did not {waiting_for} within {self.timeout_s:g}s (hung); output:\n"
            f"{self.output}\nstacks of every process:\n{stacks}",
            pytrace=False,
        )

    def wait_for(self, text: str) -> str:
        """The first line (from now on) that contains `text`; fails with the stacks at the deadline."""
        while True:
            try:
                line = self._new.get(timeout=max(0.0, self.deadline - time.monotonic()))
            except queue.Empty:
                self._hung(f"print {text!r}")
            if line is None:
                pytest.fail(f"{self.command} ended before printing {text!r}; output:\n{self.output}")
            if text in line:
                return line

    def finish(self) -> subprocess.CompletedProcess[str]:
        """Wait for the end (fails with every process's stacks at the deadline)."""
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._hung("finish")
        self._reader.join(10)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.output, "")


def run_watched(
    command: Sequence[str],
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command` to its end; past `timeout_s`, fail the test with every process's stacks."""
    return Watched(command, timeout_s, env=env, cwd=cwd).finish()
