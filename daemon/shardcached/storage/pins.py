"""Who pins what: live leases filed by job and by the process that holds them.

A lease pins its shard: the file stays, and its bytes count against the capacity, until the lease ends.
The ledger keeps, per job, the distinct shards its leases hold (two leases of one shard pin its bytes
once), and per process (the pid the Unix socket's `SO_PEERCRED` gave) the ids of its leases, so that the
leases of a process that exited can all be ended at once (peers.py notices the exit). Pure bookkeeping
on the event loop: the store calls `added` and `ended` for every lease; the service decides with
`would_exceed` whether a job may pin one more shard (`--max-job-pinned`).

A job is the `job` of the plan an open names; an open without a plan belongs to `pid <n>` (its process),
or to `unknown peer` when the process is not visible (another PID namespace, or no socket credentials).
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


@dataclass(eq=False)
class Lease:
    """A lease on a resident shard (the store hands them out): it pins the shard until it ends."""

    id: str
    entry: Entry
    expires: float
    job: str = UNKNOWN_PEER_JOB  # whose bytes it pins
    pid: int | None = None  # the process holding it, when the socket could tell (peers.py)


@dataclass(eq=False)
class JobLedger:
    """One job's pins: its live leases and the distinct shards they hold."""

    job: str
    leases: int = 0
    pinned_bytes: int = 0
    shards: dict[Entry, int] = field(default_factory=dict)  # shard -> this job's leases on it


class PinLedger:
    """Live leases by job and by process; the store reports every lease that starts or ends."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobLedger] = {}
        self.by_pid: dict[int, set[str]] = {}

    def added(self, lease: Lease) -> None:
        ledger = self.jobs.get(lease.job)
        if ledger is None:
            ledger = self.jobs[lease.job] = JobLedger(lease.job)
        ledger.leases += 1
        held = ledger.shards.get(lease.entry, 0)
        if held == 0:
            ledger.pinned_bytes += lease.entry.size
        ledger.shards[lease.entry] = held + 1
        if lease.pid:
            self.by_pid.setdefault(lease.pid, set()).add(lease.id)

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
        if lease.pid:
            ids = self.by_pid.get(lease.pid)
            if ids is not None:
                ids.discard(lease.id)
                if not ids:
                    del self.by_pid[lease.pid]

    def leases_of(self, pid: int) -> list[str]:
        """The ids of the live leases process `pid` holds."""
        return list(self.by_pid.get(pid, ()))

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
