"""Who pins what: live leases filed by job and by the holder that ends them.

A lease pins its shard: the file stays, and its bytes count against the capacity, until the lease ends.
The ledger keeps, per job, the distinct shards its leases hold (two leases of one shard pin its bytes
once), and per holder the ids of its leases, so that the leases of a holder that is gone can all be ended
at once. A holder is a client's session (`session <id>`: its connection closed, sessions.py) or, for a
client without sessions, its process (`pid <n>` from the Unix socket's `SO_PEERCRED`: it exited,
peers.py). Pure bookkeeping on the event loop: the store calls `added` and `ended` for every lease; the
service decides with `would_exceed` whether a job may pin one more shard (`--max-job-pinned`).

A job is the `job` of the plan an open names; an open without a plan belongs to its session's job (its
process, as the session named it), else to `pid <n>` (its process), or to `unknown peer` when neither is
known (an older client in another PID namespace, or no socket credentials).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardcached.storage.layout import Entry

UNKNOWN_PEER_JOB = "unknown peer"


def pid_job(pid: int | None) -> str:
    """The job name of an open that names no plan: its process, as far as the daemon can see it."""
    return f"pid {pid}" if pid else UNKNOWN_PEER_JOB


def session_job(peer: int | None, pid: int | None, host: str | None) -> str | None:
    """The job of a session's opens that name no plan: its process as the daemon sees it (`pid <n>`, as
    without a session), else as the client names itself (`pid <n> on <host>`: another PID namespace), else
    None (the session's own name)."""
    if peer:
        return pid_job(peer)
    if pid is None:
        return None
    return f"pid {pid} on {host}" if host else f"pid {pid} in another PID namespace"


def pid_holder(pid: int) -> str:
    """The holder key of the leases a process without a session holds (ended when it exits)."""
    return f"pid {pid}"


@dataclass(eq=False)
class Lease:
    """A lease on a resident shard (the store hands them out): it pins the shard until it ends."""

    id: str
    entry: Entry
    expires: float
    job: str = UNKNOWN_PEER_JOB  # whose bytes it pins
    holder: str | None = None  # what ends it when gone: a session or a visible process


@dataclass(eq=False)
class JobLedger:
    """One job's pins: its live leases and the distinct shards they hold."""

    job: str
    leases: int = 0
    pinned_bytes: int = 0
    shards: dict[Entry, int] = field(default_factory=dict)  # shard -> this job's leases on it


class PinLedger:
    """Live leases by job and by holder; the store reports every lease that starts or ends."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobLedger] = {}
        self.by_holder: dict[str, set[str]] = {}

    def added(self, lease: Lease) -> None:
        ledger = self.jobs.get(lease.job)
        if ledger is None:
            ledger = self.jobs[lease.job] = JobLedger(lease.job)
        ledger.leases += 1
        held = ledger.shards.get(lease.entry, 0)
        if held == 0:
            ledger.pinned_bytes += lease.entry.size
        ledger.shards[lease.entry] = held + 1
        if lease.holder is not None:
            self.by_holder.setdefault(lease.holder, set()).add(lease.id)

    def ended(self, lease: Lease) -> None:
        ledger = self.jobs.get(lease.job)
        if ledger is not None:
            ledger.leases -= 1
            held = ledger.shards.pop(lease.entry, 0) - 1
            if held > 0:
                ledger.shards[lease.entry] = held
            else:
                ledger.pinned_bytes -= lease.entry.size
            if ledger.leases <= 0:
                del self.jobs[lease.job]
        if lease.holder is not None:
            ids = self.by_holder.get(lease.holder)
            if ids is not None:
                ids.discard(lease.id)
                if not ids:
                    del self.by_holder[lease.holder]

    def leases_of(self, holder: str) -> list[str]:
        """The ids of the live leases `holder` holds."""
        return list(self.by_holder.get(holder, ()))

    def pinned_by(self, job: str) -> int:
        ledger = self.jobs.get(job)
        return 0 if ledger is None else ledger.pinned_bytes

    def would_exceed(self, job: str, entry: Entry, limit: int) -> bool:
        """Whether one more lease of `entry` would take `job` past `limit` pinned bytes.

        A shard the job already pins adds nothing, and a job that pins nothing may always pin one shard
        (a shard larger than the limit stays readable, one at a time).
        """
        ledger = self.jobs.get(job)
        if ledger is None or entry in ledger.shards:
            return False
        return ledger.pinned_bytes + entry.size > limit

    @property
    def pinned_bytes(self) -> int:
        """Bytes pinned by all jobs (a shard two jobs lease counts for each)."""
        return sum(ledger.pinned_bytes for ledger in self.jobs.values())
