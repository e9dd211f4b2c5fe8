"""The demo's coordinator: starts the rank processes, turns their reports and the daemon's counters into table
rows, watches their progress, and stops them (each rank with its DataLoader workers, `trainer_demo.stopping`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import queue
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from shardcache.daemon_access.daemon_client import DaemonClient
from trainer_demo.data import DemoDataset
from trainer_demo.rank import EpochReport, RankConfig, run_rank
from trainer_demo.stopping import ProgressWatch, Stalled, kill_group
from trainer_demo.table import EpochRow

_OPEN_WAIT_SUM = re.compile(r"^shardcache_open_wait_seconds_sum(?:\{\})? (\S+)$", re.MULTILINE)
EXIT_WAIT_S = 10.0  # after the last barrier, how long the ranks get to exit on their own


def open_wait_seconds(metrics_url: str | None) -> float | None:
    """The daemon's total time spent in opens waiting for shards (None when its metrics are not reachable)."""
    if metrics_url is None:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as answer:  # noqa: S310 - loopback URL we built
            text = answer.read().decode()
    except OSError:
        return None
    match = _OPEN_WAIT_SUM.search(text)
    return float(match.group(1)) if match else None


class Coordinator:
    """Runs the rank processes and turns their reports and the daemon's counters into table rows.

    `run` raises `Stalled` when a rank reports no progress for `--stall-timeout` seconds, RuntimeError when a
    rank fails; `stop` then kills every rank's process group, whatever the ranks are doing.
    """

    def __init__(self, args: argparse.Namespace, data: DemoDataset, socket: str, metrics_url: str | None):
        self.args, self.data, self.socket, self.metrics_url = args, data, socket, metrics_url
        self.mp = multiprocessing.get_context("spawn")  # ranks must not inherit our threads and sockets
        self.events: Any = self.mp.Queue()
        self.barrier: Any = self.mp.Barrier(args.ranks + 1)
        self.processes: list[Any] = []
        self.watch = ProgressWatch(args.ranks, args.stall_timeout)

    def start(self) -> None:
        lance_dir = str(Path(self.args.cache_dir).resolve() / "preprocessed")
        hook = self.args.test_stall  # (rank, samples): a test hook, see run.build_parser
        for rank in range(self.args.ranks):
            cfg = RankConfig(
                rank=rank,
                world_size=self.args.ranks,
                train=self.data.train,
                val=self.data.val,
                socket=self.socket,
                lance_dir=lance_dir,
                epochs=self.args.epochs,
                workers=self.args.workers,
                batch_size=self.args.batch_size,
                seed=self.args.seed,
                job=f"demo-{os.getpid()}",
                hang_after_samples=hook[1] if hook and hook[0] == rank else None,
            )
            process = self.mp.Process(
                target=run_rank, args=(cfg, self.events, self.barrier), name=f"rank{rank}"
            )
            self.processes.append(process)  # before start: an interrupted start is still stopped
            process.start()

    def _check(self) -> None:
        for process in self.processes:
            if process.exitcode not in (None, 0):
                raise RuntimeError(f"{process.name} exited with status {process.exitcode}")
        stall = self.watch.stalled()
        if stall is not None:
            raise Stalled(stall)

    def _next_event(self) -> tuple[Any, ...]:
        while True:
            self._check()  # also between events: the other ranks' reports must not hide a silent one
            try:
                return tuple(self.events.get(timeout=1.0))
            except queue.Empty:
                continue

    def _barrier(self, epoch: int) -> None:
        timeout = self.args.stall_timeout or None
        try:
            self.barrier.wait(timeout=timeout)
        except threading.BrokenBarrierError:
            self._check()
            raise Stalled(
                f"the ranks reported epoch {epoch + 1} but did not all reach the barrier within "
                f"{timeout:g}s (--stall-timeout)"
            ) from None

    def run(self, client: DaemonClient) -> list[EpochRow]:
        from tqdm import tqdm

        rows = []
        before, wait_before = client.stats(), open_wait_seconds(self.metrics_url)
        for epoch in range(self.args.epochs):
            reports: list[EpochReport] = []
            total = self.data.samples or None
            with tqdm(
                total=total,
                desc=f"epoch {epoch + 1}/{self.args.epochs}",
                unit=" samples",
                file=sys.stderr,
                disable=self.args.no_progress,
                leave=True,
                dynamic_ncols=True,
            ) as bar:
                while len(reports) < self.args.ranks:
                    event = self._next_event()
                    if event[0] == "progress":
                        _, rank, samples, steps, phase = event
                        self.watch.report(rank, steps, phase)
                        bar.update(samples)
                    elif event[0] == "epoch":
                        reports.append(event[1])
                        self.watch.finished_epoch(event[1].rank)
                    else:
                        raise RuntimeError(f"rank {event[1]} failed: {event[2]}")
            after, wait_after = client.stats(), open_wait_seconds(self.metrics_url)
            shard_wait = None if wait_before is None or wait_after is None else wait_after - wait_before
            rows.append(EpochRow.of(epoch + 1, reports, before, after, shard_wait))
            before, wait_before = after, wait_after
            self._barrier(epoch)
            self.watch.next_epoch()
        return rows

    def stop(self, finished: bool) -> str | None:
        """Stop every rank with its DataLoader workers; what was killed, for the user, or None.

        `finished`: the ranks passed the last barrier and get `EXIT_WAIT_S` to exit on their own. Otherwise
        (Ctrl-C, SIGTERM, a stall, a failure) they are killed at once. Either way every rank's process group
        is then killed, so no worker outlives its rank, even one deadlocked in a fork.
        """
        started = [p for p in self.processes if p.pid is not None]
        if finished:
            deadline = time.monotonic() + EXIT_WAIT_S
            waiting = [p.sentinel for p in started]
            while waiting and (left := deadline - time.monotonic()) > 0:
                ready = multiprocessing.connection.wait(waiting, timeout=left)
                waiting = [s for s in waiting if s not in ready]
        exited = set(multiprocessing.connection.wait([p.sentinel for p in started], timeout=0))
        killed = [(rank, p.pid) for rank, p in enumerate(started) if p.sentinel not in exited]
        for process in started:  # not reaped yet: their pids, so their group ids, are still theirs
            kill_group(process.pid)  # the rank and its workers, or the workers an exited rank left
            process.kill()  # a rank that had not made its group yet (a no-op for one that exited)
        for process in started:
            process.join(timeout=5)
        self.events.close()
        self.events.join_thread()
        if not killed:
            return None
        ranks = ", ".join(str(rank) for rank, _ in killed)
        groups = ", ".join(str(pid) for _, pid in killed)
        plural = "s" if len(killed) > 1 else ""
        return f"killed rank{plural} {ranks} with their DataLoader workers (process group{plural} {groups})"
