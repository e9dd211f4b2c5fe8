"""What one simulated rank runs, in its own process: a Dataset with an explicit context, read through the
daemon of its node (a `required` client: a rank never falls back to reading S3 itself, so every byte it
reads is counted by some daemon's egress).
"""

from __future__ import annotations

import itertools
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.shards import ShardRef


@dataclass(frozen=True)
class Rank:
    """One rank of a simulated cluster: where it runs and what it reads."""

    rank: int
    world_size: int
    per_node: int
    socket: str
    shards: tuple[ShardRef, ...]
    placement: str = "auto"
    exchange: float = 0.0
    seed: int = 0

    @property
    def node(self) -> int:
        return self.rank // self.per_node

    def dataset(self) -> Dataset:
        ctx = RuntimeContext(
            rank=self.rank, world_size=self.world_size, local_world_size=self.per_node, seed=self.seed
        )
        return Dataset.from_source(
            "tars",
            list(self.shards),
            context=ctx,
            daemon=DaemonClient(socket=self.socket, required=True),
            placement=self.placement,
            **({"exchange": self.exchange} if self.exchange else {}),
        )


def run_epochs(rank: Rank, epochs: int, barrier: Any, results: Any) -> None:
    """Read `epochs` whole epochs in lockstep with the other ranks (the barrier opens each epoch); put
    (rank, epoch, keys) on `results` after each, (rank, -1, traceback) on failure."""
    try:
        ds = rank.dataset()
        for epoch in range(epochs):
            barrier.wait()
            ds.set_epoch(epoch)
            results.put((rank.rank, epoch, [s["__key__"] for s in ds]))
        barrier.wait()
    except BaseException:
        results.put((rank.rank, -1, traceback.format_exc()))
        barrier.abort()
        raise


def read_part(rank: Rank, limit: int) -> tuple[list[str], dict[str, Any]]:
    """The first `limit` samples of epoch 0, and the state after them (a checkpoint mid-epoch)."""
    it = rank.dataset().iter_context()
    try:
        keys = [s["__key__"] for s in itertools.islice(it, limit)]
        return keys, it.state_dict()
    finally:
        it.close()


def read_rest(rank: Rank, merged: dict[str, Any]) -> list[str]:
    """The rest of the checkpointed epoch on this (new) rank, from the merged state of every old rank."""
    ds = rank.dataset()
    ds.load_state_dict(merged)
    return [s["__key__"] for s in ds.iter_context()]


def run_cluster(
    context: Any,
    ranks: list[Rank],
    epochs: int,
    after_epoch: Callable[[int, dict[int, list[str]]], None],
    deadline_s: float = 120.0,
) -> None:
    """Every rank in its own process (`context`), epochs in lockstep; `after_epoch(epoch, keys by rank)`
    runs while the ranks wait for the next epoch (their plans for it registered, nothing being read)."""
    barrier = context.Barrier(len(ranks) + 1)
    results = context.Queue()
    procs = [context.Process(target=run_epochs, args=(rank, epochs, barrier, results)) for rank in ranks]
    for proc in procs:
        proc.start()
    try:
        for epoch in range(epochs):
            barrier.wait(deadline_s)
            got: dict[int, list[str]] = {}
            while len(got) < len(ranks):
                try:
                    rank, done, keys = results.get(timeout=deadline_s)
                except queue.Empty:
                    missing = sorted(set(range(len(ranks))) - set(got))
                    raise RuntimeError(f"epoch {epoch}: ranks {missing} did not finish") from None
                if done < 0:
                    raise RuntimeError(f"rank {rank} failed:\n{keys}")
                if done != epoch:
                    raise RuntimeError(f"rank {rank} reported epoch {done} during epoch {epoch}")
                got[rank] = keys
            after_epoch(epoch, got)
        barrier.wait(deadline_s)
        for proc in procs:
            proc.join(deadline_s)
            if proc.exitcode != 0:
                raise RuntimeError(f"a rank process exited with {proc.exitcode}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
