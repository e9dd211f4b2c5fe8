"""Shard order per slot and epoch, and the plans that announce it to the daemon.

Orders are deterministic from (seed, epoch, round): every rank and worker computes the same permutation, and
slot s takes the positions i with (round * n + i) % total_slots == s, so without resampling each unit is read
by exactly one slot per epoch, and with resampling successive rounds rotate units across slots.

Plans (the client side of the daemon's Belady planner): when a slot starts an epoch it registers its ordered
shard URLs for this epoch and the next (the next one from a background thread: `PlanTracker`), opens
shards with the current plan id, and deletes the plan when the epoch's iteration ends; the next epoch's
plan stays when the epoch ran to its end (the next iteration re-registers it, keeping its cursor, and the
daemon expires plans nobody uses). Nothing here runs with
`daemon=None`.

`shuffle_mode` (mvp-dataset 0.2.3's source option, tars/jsonl/parquet) picks the unit order: the kind's
default ("shard_aware" for tars and jsonl, "chunk_aware" for parquet) is the seeded permutation above, and
"none" reads the units in source order, dealt to slots the same way. Samples within a unit are always in
file order; shuffling samples is the `.shuffle()` stage's job. mvp-dataset refuses "global" for these kinds,
and so do we.

A dataset that is one piece of a longer epoch (a mini-epoch chunk) says what is read after it with two
source options: `plan_following`, a sequence of `(epoch, urls)` groups each read as its own dataset at that
epoch, and `job`, the job id every piece shares. Its "next" plan is then this slot's order over those groups
instead of the same shards at epoch + 1, so the daemon prefetches the next chunk while this one trains.

`immutable=True` declares shards that are never rewritten in place: the plans carry `"immutable": true`,
and the daemon serves its cached copies to them without checking the remote's version. A daemon older than
that field refuses it (422); the client then registers without it (`DaemonClient.register_plan`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from shardcache import forksafe
from shardcache.context import RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import ConfigError, DaemonRequestError
from shardcache.jobs import blob_hash, default_job, job_named
from shardcache.memo import IdentityMemo
from shardcache.shards import ListedUrls, ShardRef, urls_blob
from shardcache.sources.deal.order import order_at
from shardcache.sources.kinds import kind_of

logger = logging.getLogger(__name__)

# The daemon refuses a plan longer than its `--max-plan-urls` (413): the slot reads on without a plan.
PLAN_TOO_LARGE = "plan_too_large"

NextUrls = Callable[[], Sequence[str]]
"""The next epoch's (or round's) order of a slot, computed when called (`PlanTracker`'s thread calls it)."""

# Source options every kind accepts; they steer the daemon's plans, not the data, so they are left out of
# the pipeline fingerprint.
PLAN_OPTIONS = ("plan_following", "job", "node_owners", "immutable")


def check_shuffle_mode(kind: str, options: Mapping[str, object]) -> None:
    """Validate `shuffle_mode` for a kind the deal shuffles, naming the values it accepts."""
    traits = kind_of(kind)
    modes = traits.unit_shuffle_modes
    if modes is None or "shuffle_mode" not in options:
        return
    mode = options["shuffle_mode"]
    if mode not in modes:
        hint = " ('global' is not supported for this kind, as in mvp-dataset)" if mode == "global" else ""
        raise ConfigError(
            f"shuffle_mode={mode!r}: {kind} accepts {' or '.join(map(repr, modes))}{hint}; "
            f"the default {modes[0]!r} shuffles the units per epoch, 'none' keeps source order",
            code=traits.shuffle_mode_code,
        )


def shuffles_units(kind: str, options: Mapping[str, object]) -> bool:
    """Whether a source permutes its units per epoch (every kind but an explicit shuffle_mode="none")."""
    modes = kind_of(kind).unit_shuffle_modes
    return modes is None or options.get("shuffle_mode", modes[0]) != "none"


def order_neutral(kind: str, name: str, value: object) -> bool:
    """Whether option `name=value` reads the same samples in the same order as leaving it out does.

    Such options stay out of the fingerprints, so spelling a default out keeps saved states valid: the
    deal's default `shuffle_mode` of the kind, and the options the kind names itself (`SourceKind
    .order_neutral`: parquet's `use_threads`, lance's `read_batch_size`, ...).
    """
    traits = kind_of(kind)
    if traits.order_neutral(name, value):
        return True
    modes = traits.unit_shuffle_modes
    return name == "shuffle_mode" and modes is not None and value == modes[0]


def check_plan_options(options: Mapping[str, object]) -> None:
    """Validate `plan_following` (a sequence of (epoch, urls) groups), `job` (a non-empty string) and
    `immutable` (a bool)."""
    owners = options.get("node_owners")
    if owners is not None and not (
        isinstance(owners, tuple) and all(isinstance(o, tuple) and len(o) == 2 for o in owners)
    ):
        raise ConfigError("node_owners=: expected ((url, node group), ...) pairs (set by mini_epochs)")
    immutable = options.get("immutable", False)
    if not isinstance(immutable, bool):
        raise ConfigError(
            f"immutable={immutable!r}: expected True (the shards are never rewritten in place: the daemon "
            f"serves its cached copies without checking the remote) or False"
        )
    job = options.get("job")
    if job is not None and (not isinstance(job, str) or not job):
        raise ConfigError(f"job={job!r}: expected a non-empty string (the id every piece of the job shares)")
    groups = options.get("plan_following")
    if groups is None:
        return
    if isinstance(groups, str) or not isinstance(groups, Sequence):
        raise ConfigError(
            "plan_following=: expected a list of (epoch, [url, ...]) groups read after this dataset"
        )
    for group in groups:
        ok = isinstance(group, tuple | list) and len(group) == 2 and isinstance(group[0], int)
        if not ok or isinstance(group[1], str) or not isinstance(group[1], Sequence):
            raise ConfigError(f"plan_following=: group {group!r} is not an (epoch, [url, ...]) pair")
        if not all(isinstance(url, str) for url in group[1]):
            raise ConfigError(f"plan_following=: group {group!r} holds a non-string url")


def slot_order(
    n: int, ctx: RuntimeContext, epoch: int, round_index: int = 0, shuffle: bool = True
) -> list[int]:
    """Indices of the units slot `ctx.slot` reads in this epoch and round, in reading order: the positions
    i of the epoch's order with (round * n + i) % total_slots == slot, each mapped on its own
    (`sources.deal.order.order_at`): O(n / total_slots), no permutation of all n."""
    total, slot, base = ctx.total_slots, ctx.slot, round_index * n
    first = (slot - base) % total
    if not shuffle:
        return list(range(first, n, total))
    positions = np.arange(first, n, total, dtype=np.int64)
    return order_at(positions, n, ctx.seed, epoch, round_index).tolist()  # type: ignore[no-any-return]


_SHARD_HASHES: IdentityMemo[str] = IdentityMemo()


def job_id(urls: Sequence[str], seed: int) -> str:
    """The daemon job id of a dataset: the same on every rank and worker (see `shardcache.jobs`)."""
    return default_job(urls, seed)


def source_job(job: str | None, shards: Sequence[ShardRef], seed: int) -> str:
    """The daemon job id a source's plans and reports go under: its `job` hint, else its shards'.

    The shards' hash is memoised per shard list (by identity): every reader, telemetry report and epoch
    of a dataset asks for it, and at 10^6 shards it costs a pass over every URL.
    """
    if job:
        return job
    digest = _SHARD_HASHES.get(shards, seed, lambda: blob_hash(urls_blob(shards), len(shards), seed))
    return job_named(digest)


def _dedupe_consecutive(urls: Sequence[str]) -> Sequence[str]:
    if isinstance(urls, ListedUrls):
        return urls.without_repeats()
    out: list[str] = []
    for url in urls:
        if not out or out[-1] != url:
            out.append(url)
    return out


class PlanTracker:
    """Registers one slot's plans for the current and next epoch (or round) and deletes them when done.

    The current plan is registered before the first shard opens; the next one is computed and registered
    by a background thread (`start`), so a reader's first sample waits for its own epoch's order only.
    That thread works inside `forksafe.background_work()` (a fork waits for it), and every method that
    touches the next plan first waits for it; an error it met is raised there, in the iterating thread.
    """

    def __init__(self, client: DaemonClient | None, job: str, slot: int, *, immutable: bool = False) -> None:
        self.client = client
        self.job = job
        self.slot = slot
        self.immutable = immutable
        self.current: str | None = None
        self._following: tuple[int, str] | None = None
        self._generation = -1  # the client's connection generation when the plans were last registered
        self._announcing: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._refused = False  # the daemon refused this epoch's plan as too long: read on without one
        self._warned = False

    def start(self, epoch: int, urls_now: Sequence[str], urls_next: NextUrls) -> str | None:
        """Announce this epoch's order now and the next epoch's (`urls_next()`) in the background; the
        current plan id (None: no daemon)."""
        if self.client is None:
            return None
        self.finish()
        self._refused = False
        if self._following is not None and self._following[0] == epoch:
            # The plan announced as "next" during the previous epoch becomes the current one.
            self.current = self._following[1]
            self._following = None
        else:
            self._drop_following()
            self.current = self._register(epoch, urls_now)
        self._generation = self.client.generation
        self._announce_following(epoch + 1, urls_next)
        logger.debug(
            "registered plan %s for job %s slot %d epoch %d", self.current, self.job, self.slot, epoch
        )
        return self.current

    def stale(self) -> bool:
        """Whether the daemon may have lost this slot's plans: it was reached on a new connection since
        they were registered (it restarted, or this client fell back to direct reads and came back), or
        it could not be reached when they were due. One comparison; called before every shard."""
        client = self.client
        if client is None:
            return False
        return (self.current is None and not self._refused) or client.generation != self._generation

    def _register(self, epoch: int, urls: Sequence[str], *, ahead: bool = False) -> str | None:
        """Register one plan; None without a daemon, or when the daemon refused it as too long (logged
        once: reads go on through the daemon, only without prefetch for this slot)."""
        client = self.client
        if client is None:
            return None
        try:
            return client.register_plan(
                self.job, self.slot, epoch, _dedupe_consecutive(urls), ahead=ahead, immutable=self.immutable
            )
        except DaemonRequestError as exc:
            if exc.code != PLAN_TOO_LARGE:
                raise
            self._refused = True
            if not self._warned:
                self._warned = True
                logger.warning(
                    "shardcached refused the plan of job %s slot %d (%d shards): %s; reading on without "
                    "a plan (no prefetch for this slot)",
                    self.job,
                    self.slot,
                    len(urls),
                    exc.detail,
                )
            return None

    def resync(self, epoch: int, urls_remaining: Sequence[str], urls_next: NextUrls) -> str | None:
        """Register this epoch's remaining order and the next epoch's again; the current plan id.

        The remaining order, not the whole epoch: a daemon that restarted would otherwise prefetch (and
        make room for) shards this slot has already read. A daemon that kept the plans replaces the
        current one by the shorter list and keeps the next one as it is.
        """
        if self.client is None:
            return None
        self._wait()
        self.current = self._register(epoch, urls_remaining)
        self._generation = self.client.generation
        if self.current is not None:
            self._announce_following(epoch + 1, urls_next)
            logger.info(
                "re-registered the plans of job %s slot %d epoch %d with the daemon (%d shards left)",
                self.job,
                self.slot,
                epoch,
                len(urls_remaining),
            )
        return self.current

    def finish(self) -> None:
        """The epoch's iteration ended: delete its plan; the next epoch's plan stays for the daemon to see."""
        self._wait()
        if self.client is not None and self.current is not None:
            self.client.delete_plan(self.current)
        self.current = None

    def keep_following(self) -> None:
        """The iteration ran to its end: leave the next plan registered for the daemon (see the module)."""
        self._wait()
        self._following = None

    def close(self) -> None:
        """Delete every plan this tracker still holds (quietly when the daemon is gone)."""
        try:
            self.finish()
        finally:
            self._drop_following()

    def _announce_following(self, epoch: int, urls_next: NextUrls) -> None:
        client = self.client
        assert client is not None

        def announce() -> None:
            try:
                with forksafe.background_work():
                    plan = self._register(epoch, urls_next(), ahead=True)
                self._following = None if plan is None else (epoch, plan)
            except BaseException as exc:  # noqa: BLE001 - raised again in the iterating thread (`_wait`)
                self._failure = exc

        self._announcing = threading.Thread(
            target=announce, name=f"shardcache-plan-{self.job}-{self.slot}-{epoch}", daemon=True
        )
        self._announcing.start()

    def _wait(self) -> None:
        """Wait for the next plan's announcement; raise what it failed with."""
        thread, self._announcing = self._announcing, None
        if thread is not None:
            thread.join()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _drop_following(self) -> None:
        self._wait()
        if self.client is not None and self._following is not None:
            self.client.delete_plan(self._following[1])
        self._following = None
