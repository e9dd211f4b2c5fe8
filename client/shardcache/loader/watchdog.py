"""TorchLoader's stall watchdog: a loader never hangs silently.

When the main process has waited `stall_warning_s` (default 300 s; `SHARDCACHE_STALL_WARNING_S`; 0 or None
turns it off) for the next item, one warning names the DataLoader worker the merge waits on, how long ago
each worker last delivered, and where each worker is: every worker registers `faulthandler` on
`STACK_SIGNAL` at its start, writing to a file in the loader's run directory, and the watchdog sends it the
signal and reads the file. faulthandler dumps from its C signal handler, without the GIL, so a worker stuck
in C code (a lock, a socket, a decoder) shows its Python stack too. Then the loader keeps waiting; the
next stall after an item arrives warns again. Without workers (`num_workers=0`) the warning shows the main
process's threads; with thread workers (`workers="threads"`) it names the stuck worker thread and shows
every worker thread's stack, read in the process itself. docs/troubleshooting.md says how to read it.

The watchdog is one daemon thread per iteration. It sleeps on an Event, so it holds no lock a fork could
copy, and it writes the warning inside `forksafe.background_work()`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

from shardcache import forksafe
from shardcache.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_STALL_WARNING_S = 300.0
STALL_WARNING_ENV = "SHARDCACHE_STALL_WARNING_S"
# SIGUSR1 is taken by schedulers (SLURM's --signal, Lightning's requeue); SIGUSR2's default (terminate)
# is what an unregistered worker would do, and a worker that registered only writes its stack.
STACK_SIGNAL = signal.SIGUSR2
# How long the watchdog waits for a worker to write its stack after the signal.
_DUMP_WAIT_S = 2.0

# The file this worker process writes its stack to (kept open: faulthandler writes to its descriptor).
_stack_file: IO[str] | None = None
_stack_pid = -1


def stall_warning(given: float | None | object) -> float:
    """Seconds without an item before the warning (0: off): `given`, else the environment, else 300."""
    value: object = given
    name = "stall_warning_s"
    if given is _UNSET:
        raw = os.environ.get(STALL_WARNING_ENV)
        if not raw:
            return DEFAULT_STALL_WARNING_S
        name, value = STALL_WARNING_ENV, raw
    if value is None:
        return 0.0
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"{name}={value!r}: expected seconds >= 0 (0 or None turns the stall warning off)")
    return seconds


class _Unset:
    def __repr__(self) -> str:
        return "<from SHARDCACHE_STALL_WARNING_S, else 300>"


_UNSET = _Unset()


def stack_path(run_dir: str, worker: int) -> Path:
    return Path(run_dir) / f"worker-{worker}.stack"


def pid_path(run_dir: str, worker: int) -> Path:
    return Path(run_dir) / f"worker-{worker}.pid"


def register_worker(run_dir: str, worker: int) -> None:
    """In a DataLoader worker: dump this process's stacks to its stack file on `STACK_SIGNAL`.

    Once per process (a persistent worker iterates many epochs); the pid file tells the watchdog whom
    to signal.
    """
    global _stack_file, _stack_pid
    if _stack_pid == os.getpid():
        return
    # Appending: the watchdog truncates the file before each signal and the dump lands at its start.
    _stack_file = open(stack_path(run_dir, worker), "a")  # noqa: SIM115 (open for the process's life)
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    _stack_pid = os.getpid()
    temp = pid_path(run_dir, worker).with_suffix(f".{_stack_pid}")
    temp.write_text(str(_stack_pid))
    temp.replace(pid_path(run_dir, worker))


def worker_stack(run_dir: str, worker: int) -> tuple[int | None, str]:
    """(pid, stack dump) of one worker, asked for now; the text says why when there is none."""
    try:
        pid = int(pid_path(run_dir, worker).read_text())
    except (OSError, ValueError):
        return None, "(not started: no pid recorded)"
    path = stack_path(run_dir, worker)
    try:
        os.truncate(path, 0)
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        return pid, "(the process has exited)"
    except OSError as exc:
        return pid, f"(no stack: {exc})"
    # faulthandler writes the whole dump from the worker's signal handler at once: poll the file briefly
    # until it has text that stopped growing.
    deadline = time.monotonic() + _DUMP_WAIT_S
    text, size = "", -1
    while time.monotonic() < deadline:
        time.sleep(0.05)
        text = path.read_text(errors="replace")
        if text and len(text) == size:
            break
        size = len(text)
    return pid, text.strip() or f"(no stack written within {_DUMP_WAIT_S:g}s)"


def thread_stack(thread: threading.Thread) -> str:
    """Where `thread` of this process is now, most recent call last (or why there is no stack)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "(the thread has ended)"
    return "".join(traceback.format_stack(frame)).rstrip()


def main_process_stacks() -> str:
    """Every thread of this process, most recent call last (the iteration without workers)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)


class StallWatchdog:
    """Warns once per stall when `waiting_since()` is older than `after_s` (see the module).

    Args:
        after_s: Seconds of waiting before the warning.
        waiting_since: The monotonic time the main process started waiting for its next item (None: it is
            not waiting).
        describe: The warning's text for a stall of that many seconds.
    """

    def __init__(
        self, after_s: float, waiting_since: Callable[[], float | None], describe: Callable[[float], str]
    ) -> None:
        self.after_s = after_s
        self._waiting_since = waiting_since
        self._describe = describe
        self._stop = threading.Event()
        self._warned_for: float | None = None
        self._thread = threading.Thread(target=self._run, name="shardcache-stall-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = min(max(self.after_s / 4, 0.05), 5.0)
        while not self._stop.wait(interval):
            since = self._waiting_since()
            if since is None or since == self._warned_for:
                continue
            waited = time.monotonic() - since
            if waited < self.after_s:
                continue
            self._warned_for = since
            with forksafe.background_work():
                try:
                    logger.warning("%s", self._describe(waited))
                except Exception:  # the watchdog must never take the trainer down
                    logger.exception("TorchLoader stall watchdog failed to describe the stall")

    def close(self) -> None:
        self._stop.set()


def describe_stall(
    waited_s: float,
    after_s: float,
    waiting_for: int,
    arrived_at: dict[int, float],
    num_workers: int,
    run_dir: str | None,
) -> str:
    """The warning for a stall: the worker awaited, each worker's last item and where each one is now."""
    now = time.monotonic()
    lines = [
        f"TorchLoader: no item for {waited_s:.0f}s; the merge waits for "
        + (f"DataLoader worker {waiting_for} of {num_workers}" if num_workers else "the main process")
        + f" (stall_warning_s={after_s:g}; stall_warning_s=0 or {STALL_WARNING_ENV}=0 turns this warning "
        "off). Still waiting. See docs/troubleshooting.md, 'A loader that stalls'."
    ]
    if not num_workers or run_dir is None:
        lines.append("Threads of the main process (most recent call last):")
        lines.append(main_process_stacks())
        return "\n".join(lines)
    stacks = []
    for worker in range(num_workers):
        pid, stack = worker_stack(run_dir, worker)
        last = arrived_at.get(worker)
        seen = "no item yet" if last is None else f"last item {now - last:.1f}s ago"
        awaited = " <- awaited" if worker == waiting_for else ""
        lines.append(f"  worker {worker} (pid {pid}): {seen}{awaited}")
        stacks.append(f"--- worker {worker} (pid {pid}), most recent call first ---\n{stack}")
    lines.append("Where each worker is:")
    lines.extend(stacks)
    return "\n".join(lines)


def describe_thread_stall(
    waited_s: float,
    after_s: float,
    waiting_for: int,
    arrived_at: dict[int, float],
    threads: dict[int, threading.Thread],
) -> str:
    """The warning for a stall of thread workers (`workers="threads"`): the worker thread awaited, each
    one's last item and its stack, read in this process (no signal needed)."""
    now = time.monotonic()
    lines = [
        f"TorchLoader: no item for {waited_s:.0f}s; the merge waits for worker thread {waiting_for} of "
        f"{len(threads)} (stall_warning_s={after_s:g}; stall_warning_s=0 or {STALL_WARNING_ENV}=0 turns this "
        "warning off). Still waiting. See docs/troubleshooting.md, 'A loader that stalls'."
    ]
    stacks = []
    for worker, thread in sorted(threads.items()):
        last = arrived_at.get(worker)
        seen = "no item yet" if last is None else f"last item {now - last:.1f}s ago"
        awaited = " <- awaited" if worker == waiting_for else ""
        lines.append(f"  worker {worker} (thread {thread.name}): {seen}{awaited}")
        stacks.append(
            f"--- worker {worker} (thread {thread.name}), most recent call last ---\n{thread_stack(thread)}"
        )
    lines.append("Where each worker thread is:")
    lines.extend(stacks)
    return "\n".join(lines)
