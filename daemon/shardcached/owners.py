"""Leases and plans belong to the client process that asked for them; what a job may pin is bounded.

A request names its holder in one of two ways. A client with a session (sessions.py) names it in its
opens and plan registrations: the holder is gone when the session's connection closes, which the kernel
does when the process dies, in whatever PID namespace it runs. A client without sessions (an older one)
is known by the pid the Unix socket gives (`SO_PEERCRED`, peers.py): gone when that process exits, where
the daemon can see it. When a holder is gone (an OOM kill, a `kill -9` of the trainer or of its process
group), its leases end at once and its plans are dropped after `PLAN_ORPHAN_GRACE_S` (or
`--plan-stale-s`, when shorter): no other job waits for the lease TTL (`--lease-ttl-s`, which stays the
last resort for an older client in a PID namespace the daemon cannot see).

Plans get a grace period, leases none: a DataLoader's workers exit at the end of each epoch and the next
epoch's workers register the same plans again (the daemon keeps the id and cursor of a plan registered
again with the same urls), and an open under a plan keeps it too. Only a plan nobody takes over goes.

The bound (`--max-job-pinned`, a share of the capacity by default): a job (a plan's `job`, else the process,
pins.py) whose leases already pin that many bytes is refused one more shard at once with 507
`cache_pinned`, so a job with many readers, or a client that never closes what it opens, cannot pin the
whole cache; its readers then read directly for a while (the client remembers the refusal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shardcached.errors import InsufficientCapacity
from shardcached.metrics import Metrics
from shardcached.peers import PeerWatch
from shardcached.planning import Planner
from shardcached.sessions import Session, Sessions
from shardcached.storage import Entry, Store
from shardcached.storage.pins import pid_holder, pid_job

logger = logging.getLogger(__name__)

# How long the plans of an exited process stay for a successor to take over (the next epoch's DataLoader
# workers start within a few seconds of the last ones' exit).
PLAN_ORPHAN_GRACE_S = 5.0
PINNED_CODE = "cache_pinned"


class Owners:
    """Files leases and plans under their holder, ends them when it is gone, and bounds pins per job."""

    def __init__(
        self,
        store: Store,
        planner: Planner,
        metrics: Metrics,
        *,
        max_job_pinned: int,
        changed: Callable[[], None],
        use_pidfd: bool = True,
    ) -> None:
        self.store = store
        self.planner = planner
        self.metrics = metrics
        self.max_job_pinned = max_job_pinned
        self._changed = changed
        self.peers = PeerWatch(self._exited, use_pidfd=use_pidfd)
        self.sessions = Sessions(self._session_ended)
        self._plans_by_holder: dict[str, set[str]] = {}
        self.leases_of_exited = 0

    def job_of(self, plan: str | None, pid: int | None, session: Session | None = None) -> str:
        """Whose pins an open adds to: its plan's job, else its session's (its process), else its pid's."""
        job = self.planner.job_of(plan) if plan is not None else None
        if job is not None:
            return job
        return session.job if session is not None else pid_job(pid)

    def check_bound(self, job: str, shard: Entry | str) -> None:
        """Refuse one more lease of `shard` when `job` would pin more than `--max-job-pinned`.

        A URL is checked only when the shard is resident (an open checks again once it is fetched).

        Raises:
            InsufficientCapacity: 507 `cache_pinned`, naming the job and what to do.
        """
        entry = self.store.by_url.get(shard) if isinstance(shard, str) else shard
        if entry is None:
            return
        pins = self.store.pins
        if pins.would_exceed(job, entry, self.max_job_pinned):
            raise InsufficientCapacity(
                f"job {job!r} already pins {pins.pinned_by(job)} bytes with open shards, and {entry.url} "
                f"({entry.size} bytes) would take it past its bound of {self.max_job_pinned} bytes "
                f"(shardcached --max-job-pinned); close shards once read (a client that never closes what it "
                f"opens pins the cache), or raise --max-job-pinned; the shard is read directly meanwhile",
                code=PINNED_CODE,
            )

    def lease(self, entry: Entry, job: str, pid: int | None, session: Session | None = None) -> str:
        """Lease `entry` to `job`, held by `session`, else by process `pid` (followed until it exits).

        Raises:
            NotFound: 404 `unknown_session`: the session ended while the open waited (its holder is gone).
        """
        holder = self._holder(pid, session)
        return self.store.lease(entry, job, holder)

    def plan_added(self, plan_id: str, pid: int | None, session: Session | None = None) -> None:
        """`session` (else process `pid`) registered (or registered again) `plan_id`: one of its holders."""
        holder = self._holder(pid, session)
        if holder is not None:
            self._plans_by_holder.setdefault(holder, set()).add(plan_id)

    def _holder(self, pid: int | None, session: Session | None) -> str | None:
        """What ends a request's leases and plans: its session, else its process where the daemon sees it."""
        if session is not None:
            self.sessions.check_live(session)
            return session.holder
        if self.peers.watch(pid) and pid is not None:
            return pid_holder(pid)
        return None

    def sweep(self) -> None:
        """Housekeeping (every second): processes without a pidfd are checked here."""
        self.peers.sweep()

    def begin_shutdown(self) -> None:
        """End every session's answer, so that uvicorn's graceful shutdown does not wait for them."""
        self.sessions.close_all()

    def close(self) -> None:
        self.peers.close()

    def _exited(self, pid: int) -> None:
        self._gone(pid_holder(pid), "process_exit", f"process {pid} exited")

    def _session_ended(self, session: Session) -> None:
        self._gone(session.holder, "session_closed", f"the session of {session.job} closed")

    def _gone(self, holder: str, reason: str, what: str) -> None:
        """`holder` is gone: end its leases now, drop its plans after the grace unless taken over."""
        ended = self.store.release_holder(holder)
        plans = self._plans_by_holder.pop(holder, set())
        grace = min(PLAN_ORPHAN_GRACE_S, self.planner.stale_after_s)
        orphaned = sum(self.planner.orphan(plan_id, grace) for plan_id in plans)
        if ended:
            self.leases_of_exited += ended
            self.metrics.abandoned_leases.labels(reason).inc(ended)
        if ended or orphaned:
            logger.info(
                "%s holding %d leases and %d plans: leases ended, plans dropped in %.0f s unless another "
                "process registers them again",
                what,
                ended,
                orphaned,
                grace,
            )
            self._changed()
