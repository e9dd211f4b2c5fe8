"""How the demo stops: ranks in their own process groups, a progress watch, and signals as exceptions.

Every rank makes itself the leader of a new process group (`become_group_leader`) before it starts anything,
so each DataLoader worker it forks (or spawns: fork and exec keep the group) belongs to that group from birth,
and `kill_group` ends the rank and all its workers with one `killpg(SIGKILL)`, whatever state they are in.
Process groups rather than `prctl(PR_SET_PDEATHSIG)` in the workers: a worker deadlocked right after the fork
(the hang this guards against) may never run the code that would call `prctl`; the death signal only fires
when the rank dies, not when the coordinator finds a living rank stuck; and it does not reach a worker's own
children. A rank outside the terminal's foreground group does not get Ctrl-C itself: the coordinator alone
decides, and stops the ranks, then the daemon, then the S3 endpoint.

Progress is what ranks report (`ProgressWatch`): a rank that reports nothing for `--stall-timeout` seconds
while it trains or validates has stalled; a rank that has finished its epoch and waits at the barrier for
the others has not.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

STARTING = "starting"
START_S = 120.0  # the least time a rank may take to start before it counts as stalled


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so every `finally` stops what it started."""

    exit_status = 128 + signal.SIGTERM


class Stalled(RuntimeError):
    """A rank made no progress for the stall timeout; the message says which one, since when, doing what."""


def become_group_leader() -> None:
    """Make this process (a rank) the leader of a new process group that its workers will inherit."""
    os.setpgid(0, 0)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group `pgid`: a rank and its DataLoader workers.

    Call it before the rank is reaped where possible: until then its pid, so its group id, cannot be reused
    (nor after, while a worker of the group is alive). A rank that has not reached `become_group_leader`
    has no group yet, and no workers: the caller kills the rank itself too.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's stack of that process to its stderr (a hung rank, a worker)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt (Python's default) and SIGTERM raises `Terminated`; SIGUSR1 dumps the
    stacks (`dump_stacks_on_sigusr1`). Only in the main thread (the only one where Python runs signal
    handlers); elsewhere, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    dump_stacks_on_sigusr1()
    try:
        yield
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while stopping, so a second Ctrl-C cannot leave half of the demo running.

    Stopping is bounded (SIGKILL for the ranks, a few seconds for each server), so nothing is lost.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class RankState:
    """What the coordinator last heard from one rank."""

    last: float  # monotonic clock
    wall: float  # the same moment, as a wall-clock time for messages
    steps: int = 0
    phase: str = STARTING
    waiting: bool = False  # finished the epoch, waiting at the barrier for the others


class ProgressWatch:
    """Per rank, when it last reported progress; `stalled` names a rank silent for `timeout_s` seconds.

    A rank's start-up (imports, building its pipeline), before its first report, may take `start_s` seconds if
    that is longer: importing torch takes seconds on busy cores. A `timeout_s` of 0 never finds a stall. The
    clocks are injectable for tests.
    """

    def __init__(
        self,
        ranks: int,
        timeout_s: float,
        start_s: float = START_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s, self.start_s, self.clock, self.wall = timeout_s, start_s, clock, wall
        self.epoch = 0
        self.ranks = [RankState(clock(), wall()) for _ in range(ranks)]

    def report(self, rank: int, steps: int, phase: str) -> None:
        """Rank `rank` made progress: it has taken `steps` training steps so far and is now in `phase`."""
        self.ranks[rank] = RankState(self.clock(), self.wall(), steps, phase)

    def finished_epoch(self, rank: int) -> None:
        """Rank `rank` reported its epoch and now waits at the barrier: not a stall, however long it waits."""
        state = self.ranks[rank]
        state.waiting, state.phase = True, "waiting at the barrier"

    def next_epoch(self) -> None:
        """Every rank passed the barrier and starts the next epoch now."""
        self.epoch += 1
        now, wall = self.clock(), self.wall()
        for state in self.ranks:
            state.last, state.wall, state.waiting, state.phase = now, wall, False, "training"

    def stalled(self) -> str | None:
        """A message naming the first rank that made no progress for `timeout_s` seconds, else None."""
        if self.timeout_s <= 0:
            return None
        now = self.clock()
        for rank, state in enumerate(self.ranks):
            limit = max(self.timeout_s, self.start_s) if state.phase == STARTING else self.timeout_s
            if not state.waiting and now - state.last >= limit:
                return self._describe(rank, now - state.last)
        return None

    def _describe(self, rank: int, silent_s: float) -> str:
        state = self.ranks[rank]
        since = time.strftime("%H:%M:%S", time.localtime(state.wall))
        others = [
            f"rank {other} was {state_of.phase}" for other, state_of in enumerate(self.ranks) if other != rank
        ]
        return (
            f"rank {rank} made no progress for {silent_s:.0f}s (--stall-timeout {self.timeout_s:g}), since "
            f"{since}: {state.phase} in epoch {self.epoch + 1}, {state.steps} training steps done"
            + (f"; {', '.join(others)}" if others else "")
        )
